"""deploy/: the container image and the Kubernetes manifests (issue 21), checked without a
container daemon and without a cluster.

- deploy/Dockerfile: its stages are parsed. The runtime stage must install the Debian package of
  every shared library the built `oml` links (readelf's NEEDED, resolved by ldd, owner by
  `dpkg -S` on this Debian 12 machine), and every library ldd lists must come with them through
  Debian's Depends or be in the slim base; it must install nothing the build stage alone needs.
  The build stage must install the build half of scripts/install-deps.sh. USER numeric non-root,
  ENTRYPOINT exec form.
- deploy/kubernetes: the base and each overlay are rendered with the real kustomize; every core
  object is validated by kubernetes-validate (strict: unknown fields are errors) against
  Kubernetes K8S_VERSION, and every custom resource against its operator's own CRD schema
  (CloudNativePG, its Barman Cloud plugin, prometheus-operator), made strict the same way. Then
  what oml needs of them: probes, security contexts, the lake writers' lease layout, the key-less
  reconciler, the secrets each pod reads, the settings (`oml --help` on the rendered oml.toml),
  the metrics the alerts read.
- Negative checks prove each validator bites, with the exact error.

The pinned tools come from scripts/install-deploy-tools.sh (kustomize and the CRDs, from the Go
module proxy into ~/.cache/oml, once) and tests/requirements.txt (kubernetes-validate,
jsonschema). Offline once installed.
"""
import copy
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from conftest import OML_BIN

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
K8S = ROOT / "deploy" / "kubernetes"
OVERLAYS = ["base", "overlays/production"]
MAKE_SECRETS = K8S / "secrets" / "make-secrets.sh"

# The Kubernetes version the manifests are validated against (one of the schema sets
# kubernetes-validate 1.37.0 bundles: 1.25 .. 1.37). 1.30 is the oldest this deployment supports:
# CronJob timeZone (GA 1.27), Job podFailurePolicy (on by default since 1.26).
K8S_VERSION = "1.30"

# The image's user (deploy/Dockerfile USER); the pods' runAsUser/fsGroup must be the same.
IMAGE_UID = 10001

# scripts/install-deps.sh packages the image's build does not need, and why.
TEST_OR_LOCAL_ONLY = {
    "postgresql-15": "the test clusters and the local profile's private cluster",
    "postgresql-contrib": "the test clusters",
    "postgresql-15-plpgsql-check": "the PL/pgSQL lint of tests/test_db_boundary.py",
    "poppler-utils": "pdftotext, a second PDF reader in src/review/extract_test.cc",
    "python3-venv": "the pytest venv",
    "sudo": "install-deps itself",
    "locales": "the translated-messages tests",
    "ccache": "a compiler cache; a one-shot image build has nothing to reuse",
}
# Runtime packages that own no library oml links, and why they are there.
RUNTIME_EXTRAS = {
    "ca-certificates": "the TLS trust store for the S3 endpoints",
    "libmagic-mgc": "magic.mgc, the database magic_load(m, nullptr) reads at run time",
}
# Packages the runtime stage must never install (besides every *-dev), whatever else it does.
BUILD_TOOLS = {"build-essential", "cmake", "ninja-build", "pkg-config", "ccache", "mold", "git", "curl",
               "cargo", "rustc", "rustup", "make", "binutils", "googletest", "gcc", "g++", "cpp", "clang"}


# --- the Dockerfile ----------------------------------------------------------------------------

def dockerfile_instructions(text):
    """(INSTRUCTION, arguments) in order. Comment lines go, also inside a continued instruction
    (as Docker does); a trailing backslash continues the line."""
    out, cur = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        if cur.strip():
            word, _, rest = cur.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def dockerfile_stages(text):
    """[{"base", "name", "instructions"}] per FROM."""
    stages = []
    for instr, args in dockerfile_instructions(text):
        if instr == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].lower() == "as" else None
            stages.append({"base": words[0], "name": name, "instructions": []})
        elif stages:
            stages[-1]["instructions"].append((instr, args))
    return stages


def apt_installs(stage):
    """(packages, every install has --no-install-recommends) of a stage's `apt-get install`s."""
    pkgs, no_recommends = [], True
    for instr, args in stage["instructions"]:
        if instr != "RUN":
            continue
        for segment in re.split(r"&&|\|\||;|\|", args):
            words = shlex.split(segment)
            if "apt-get" in words and "install" in words:
                rest = words[words.index("install") + 1:]
                no_recommends &= "--no-install-recommends" in rest
                pkgs += [w for w in rest if not w.startswith("-")]
    return pkgs, no_recommends


def install_deps_packages():
    """scripts/install-deps.sh's APT_PACKAGES (the unconditional list)."""
    text = (ROOT / "scripts" / "install-deps.sh").read_text()
    m = re.search(r"^APT_PACKAGES=\(([^)]*)\)", text, re.M)
    assert m, "APT_PACKAGES=( ... ) not found in scripts/install-deps.sh"
    return m.group(1).split()


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def debian12():
    version = Path("/etc/debian_version").read_text().strip() if Path("/etc/debian_version").exists() else ""
    if not version.startswith("12"):
        pytest.skip(f"the runtime stage is Debian 12's (bookworm); dpkg here is not ({version or 'not Debian'})")
    return version


@functools.lru_cache(maxsize=None)
def linked_libraries():
    """(NEEDED sonames of oml, {soname or path: resolved path} of every library ldd lists)."""
    assert Path(OML_BIN).is_file(), f"OML_BIN={OML_BIN} is not a file (build oml first)"
    d = run(["readelf", "-d", OML_BIN])
    assert d.returncode == 0, d.stderr
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", d.stdout)
    assert needed, d.stdout
    ldd = run(["ldd", OML_BIN])
    assert ldd.returncode == 0, ldd.stderr
    libs = {}
    for line in ldd.stdout.splitlines():
        line = line.strip()
        assert "not found" not in line, f"ldd: {line}"
        if m := re.match(r"(\S+) => (/\S+) \(0x", line):
            libs[m.group(1)] = m.group(2)
        elif m := re.match(r"(/\S+) \(0x", line):  # the dynamic loader
            libs[m.group(1)] = m.group(1)
    return needed, libs


def _path_variants(p):
    """The names dpkg may have recorded for a library path on a merged-/usr system: /lib/...
    and /usr/lib/... name the same file, and dpkg knows the one its package shipped."""
    out = []
    for q in (p, os.path.realpath(p)):
        for v in (q, "/usr" + q if q.startswith(("/lib", "/lib64")) else q[4:] if q.startswith("/usr/lib") else q):
            if v not in out:
                out.append(v)
    return out


@functools.lru_cache(maxsize=None)
def library_owners():
    """{soname or path: Debian package} for every library ldd lists (one `dpkg -S` call)."""
    _, libs = linked_libraries()
    variants = {name: _path_variants(path) for name, path in libs.items()}
    every = sorted({v for vs in variants.values() for v in vs})
    r = run(["dpkg", "-S", *every])  # exit 1 when some variant is unknown: expected
    owner_of = {}
    for line in r.stdout.splitlines():
        if line.startswith("diversion by") or ": " not in line:
            continue
        pkgs, path = line.rsplit(": ", 1)
        owner_of[path] = pkgs.split(", ")[0].split(":")[0]
    owners = {}
    for name, vs in variants.items():
        found = [owner_of[v] for v in vs if v in owner_of]
        assert found, f"dpkg -S knows no package for {name} ({libs[name]}); tried {vs}"
        owners[name] = found[0]
    return owners


@functools.lru_cache(maxsize=None)
def dpkg_database():
    """The installed packages of this machine: {package: (essential, priority, [[alternatives]])}
    and {virtual: {providers}}."""
    fmt = "${db:Status-Abbrev}\t${Package}\t${Essential}\t${Priority}\t${Pre-Depends}\t${Depends}\t${Provides}\n"
    r = run(["dpkg-query", "-W", "-f", fmt])
    assert r.returncode == 0, r.stderr
    pkgs, provides = {}, {}

    def names(field):
        groups = []
        for group in filter(None, (g.strip() for g in field.split(","))):
            groups.append([re.sub(r"\s*\(.*?\)|:\w+$", "", alt.strip()).split(":")[0]
                           for alt in group.split("|")])
        return groups

    for line in r.stdout.splitlines():
        status, name, essential, priority, pre, dep, prov = line.split("\t")
        if not status.startswith("ii"):
            continue
        deps = names(pre) + names(dep)
        old = pkgs.get(name)
        pkgs[name] = (essential == "yes", priority, deps + (old[2] if old else []))
        for group in names(prov):
            provides.setdefault(group[0], set()).add(name)
    return pkgs, provides


def dependency_closure(start):
    """`start` and everything they depend on, as apt would install it on this machine: of
    alternatives (a | b) the first one installed here (a virtual name through its provider)."""
    pkgs, provides = dpkg_database()
    seen, todo = set(), list(start)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for group in pkgs.get(p, (False, "", []))[2]:
            for alt in group:
                real = [alt] if alt in pkgs else sorted(provides.get(alt, ()))
                if real:
                    todo.append(real[0])
                    break
    return seen


@functools.lru_cache(maxsize=None)
def slim_base():
    """What debian:bookworm-slim holds: the Essential and Priority: required packages and their
    dependencies (debootstrap --variant=minbase, which makes the image, installs exactly those),
    computed from this Debian 12 machine's dpkg database: libc6, libgcc-s1 and libstdc++6
    among them."""
    pkgs, _ = dpkg_database()
    return dependency_closure([p for p, (ess, prio, _) in pkgs.items() if ess or prio == "required"])


def runtime_findings(dockerfile_text):
    """What is wrong with the runtime stage's packages, as lists of names (empty when right)."""
    stages = dockerfile_stages(dockerfile_text)
    runtime, build = stages[-1], stages[0]
    rt_pkgs, _ = apt_installs(runtime)
    build_pkgs, _ = apt_installs(build)
    needed, libs = linked_libraries()
    owners = library_owners()
    base = slim_base()
    pkgs, _ = dpkg_database()
    # NEEDED names sonames; ldd keys the dynamic loader by its path.
    key = {s: s if s in libs else next(n for n in libs if os.path.basename(n) == s) for s in needed}
    direct = {owners[key[s]]: s for s in needed}
    covered = dependency_closure(set(rt_pkgs) | base)
    return {
        # A library oml itself links whose package neither the stage nor the base installs.
        "missing": sorted(f"{p} ({s})" for p, s in direct.items() if p not in rt_pkgs and p not in base),
        # A library ldd lists (a dependency of one) that no Depends brings.
        "missing_transitive": sorted({f"{owners[n]} ({n})" for n in libs if owners[n] not in covered}),
        # A runtime package that owns no linked library and is not a known data/runtime need.
        "extra": sorted(p for p in rt_pkgs if p not in direct and p not in RUNTIME_EXTRAS),
        # Build-only packages: any -dev, a compiler or build tool, or anything of the build stage's
        # list except what both stages need.
        "build_only": sorted(p for p in rt_pkgs
                             if p.endswith("-dev") or p in BUILD_TOOLS
                             or re.fullmatch(r"(gcc|g\+\+|cpp|clang|llvm)-\d+", p)
                             or (p in build_pkgs and p not in RUNTIME_EXTRAS)),
        # Runtime packages this machine does not have: their dependencies cannot be checked.
        "unknown": sorted(p for p in rt_pkgs if p not in pkgs),
    }


def user_and_entrypoint_findings(dockerfile_text):
    runtime = dockerfile_stages(dockerfile_text)[-1]
    problems = []
    users = [a for i, a in runtime["instructions"] if i == "USER"]
    if not users:
        problems.append("the runtime stage has no USER")
    elif not re.fullmatch(r"\d+(:\d+)?", users[-1]):
        problems.append(f"USER {users[-1]} is not numeric (runAsNonRoot needs a numeric uid)")
    elif int(users[-1].split(":")[0]) == 0:
        problems.append(f"USER {users[-1]} is root")
    eps = [a for i, a in runtime["instructions"] if i == "ENTRYPOINT"]
    try:
        ep = json.loads(eps[-1]) if eps else None
    except json.JSONDecodeError:
        ep = None
    if not isinstance(ep, list):
        problems.append(f"ENTRYPOINT is not in exec form: {eps[-1] if eps else None}")
    elif ep != ["/usr/local/bin/oml"]:
        problems.append(f"ENTRYPOINT is {ep}, not [\"/usr/local/bin/oml\"]")
    return problems


def test_dockerfile_builds_in_a_bookworm_stage_and_runs_in_bookworm_slim():
    text = DOCKERFILE.read_text()
    stages = dockerfile_stages(text)
    assert [(s["base"], s["name"]) for s in stages] == [("debian:bookworm", "build"),
                                                        ("debian:bookworm-slim", "runtime")]
    build, runtime = stages
    runs = " ".join(a for i, a in build["instructions"] if i == "RUN")
    # The real build (Makefile `build`), for the oml target.
    assert "cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo" in runs
    assert "cmake --build /build --target oml" in runs
    # rustup installs the toolchain rust-toolchain.toml pins.
    channel = re.search(r'channel = "([^"]+)"', (ROOT / "rust/oml-storage/rust-toolchain.toml").read_text()).group(1)
    assert f"ARG RUST_TOOLCHAIN={channel}" in text
    assert "sh.rustup.rs" in runs and '--default-toolchain "${RUST_TOOLCHAIN}"' in runs
    # The runtime stage gets the binary from the build stage, nothing else.
    copies = [a for i, a in runtime["instructions"] if i == "COPY"]
    assert copies == ["--from=build /build/oml.stripped /usr/local/bin/oml"]
    for stage in stages:
        _, no_recommends = apt_installs(stage)
        assert no_recommends, f"stage {stage['name']}: apt-get install without --no-install-recommends"


def test_build_stage_installs_the_build_half_of_install_deps():
    build_pkgs, _ = apt_installs(dockerfile_stages(DOCKERFILE.read_text())[0])
    wanted = set(install_deps_packages()) - set(TEST_OR_LOCAL_ONLY)
    assert sorted(wanted - set(build_pkgs)) == [], "missing from the build stage"
    # Beyond install-deps: only what fetches rustup.
    assert sorted(set(build_pkgs) - wanted) == ["ca-certificates"]


def test_runtime_stage_installs_the_package_of_every_library_oml_links(debian12):
    f = runtime_findings(DOCKERFILE.read_text())
    assert f["unknown"] == []
    assert f["missing"] == [], "libraries oml links whose package the runtime stage does not install"
    assert f["missing_transitive"] == [], "libraries ldd lists that no Depends of the runtime packages brings"
    # The slim base provides the C and C++ runtimes.
    owners = library_owners()
    assert {owners["libc.so.6"], owners["libgcc_s.so.1"], owners["libstdc++.so.6"]} == {"libc6", "libgcc-s1", "libstdc++6"}
    assert {"libc6", "libgcc-s1", "libstdc++6"} <= slim_base()


def test_runtime_stage_installs_nothing_the_build_alone_needs(debian12):
    f = runtime_findings(DOCKERFILE.read_text())
    assert f["build_only"] == []
    assert f["extra"] == [], "runtime packages that own no library oml links"


def test_runtime_stage_runs_as_numeric_non_root_user_with_exec_form_entrypoint():
    text = DOCKERFILE.read_text()
    assert user_and_entrypoint_findings(text) == []
    runtime = dockerfile_stages(text)[-1]
    assert [a for i, a in runtime["instructions"] if i == "USER"] == [f"{IMAGE_UID}:{IMAGE_UID}"]
    exposed = {int(p) for i, a in runtime["instructions"] if i == "EXPOSE" for p in a.split()}
    # The ports of listen, metrics_listen and lakewriter_metrics_listen in the manifests' oml.toml.
    toml = (K8S / "base" / "oml.toml").read_text()
    ports = {int(m) for m in re.findall(r'^(?:listen|metrics_listen|lakewriter_metrics_listen) = "0\.0\.0\.0:(\d+)"', toml, re.M)}
    assert exposed == ports == {8470, 8471, 8472}


def test_dockerfile_checks_name_what_is_wrong(debian12):
    text = DOCKERFILE.read_text()
    # The runtime stage without libpq5: libpq.so.5 is missing, and so are the libraries only
    # libpq5's dependencies bring (Kerberos, LDAP, SASL).
    f = runtime_findings(text.replace(" libpq5 ", " "))
    assert f["missing"] == ["libpq5 (libpq.so.5)"]
    assert "libldap-2.5-0 (libldap-2.5.so.0)" in f["missing_transitive"]
    assert "libgssapi-krb5-2 (libgssapi_krb5.so.2)" in f["missing_transitive"]
    # A -dev package and a compiler in the runtime stage.
    f = runtime_findings(text.replace(" libpq5 ", " libpq5 libpq-dev g++-12 "))
    assert f["build_only"] == ["g++-12", "libpq-dev"]
    assert f["extra"] == ["g++-12", "libpq-dev"]
    assert f["missing"] == []
    # A package that owns nothing oml links.
    assert runtime_findings(text.replace(" libpq5 ", " libpq5 libcurl4 "))["extra"] == ["libcurl4"]
    # USER and ENTRYPOINT.
    assert user_and_entrypoint_findings(text.replace("USER 10001:10001", "USER oml")) == [
        "USER oml is not numeric (runAsNonRoot needs a numeric uid)"]
    assert user_and_entrypoint_findings(text.replace("USER 10001:10001", "USER 0")) == ["USER 0 is root"]
    assert user_and_entrypoint_findings(text.replace('ENTRYPOINT ["/usr/local/bin/oml"]', "ENTRYPOINT /usr/local/bin/oml serve")) == [
        "ENTRYPOINT is not in exec form: /usr/local/bin/oml serve"]


# --- the tools ---------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def tools():
    """scripts/install-deploy-tools.sh: installs what is missing (once), prints the paths."""
    r = run([str(ROOT / "scripts" / "install-deploy-tools.sh"), "--print"], timeout=900)
    if r.returncode == 3 and "'go' is not on PATH" in r.stderr:
        pytest.skip("kustomize and the operators' CRDs are not installed, and `go` (needed once to fetch "
                    "them from the Go module proxy) is not on PATH: " + r.stderr.strip())
    assert r.returncode == 0, r.stderr
    return dict(line.split("=", 1) for line in r.stdout.splitlines())


def kustomize_build(tools, path):
    r = run([tools["KUSTOMIZE"], "build", str(path)], timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.fixture(scope="session")
def rendered(tools):
    return {o: kustomize_build(tools, K8S / o) for o in OVERLAYS}


class CrdLoader(yaml.CSafeLoader if hasattr(yaml, "CSafeLoader") else yaml.SafeLoader):
    """prometheus-operator's CRDs hold `=` as an enum value (PyYAML's tag:yaml.org,2002:value)."""


CrdLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))

# Every custom resource kind the manifests use: (group, kind) -> (the tools' key of its CRD folder).
CUSTOM_KINDS = {
    ("postgresql.cnpg.io", "Cluster"): "CNPG_CRDS",
    ("postgresql.cnpg.io", "ScheduledBackup"): "CNPG_CRDS",
    ("barmancloud.cnpg.io", "ObjectStore"): "BARMAN_CLOUD_CRDS",
    ("monitoring.coreos.com", "ServiceMonitor"): "PROMETHEUS_OPERATOR_CRDS",
    ("monitoring.coreos.com", "PodMonitor"): "PROMETHEUS_OPERATOR_CRDS",
    ("monitoring.coreos.com", "PrometheusRule"): "PROMETHEUS_OPERATOR_CRDS",
}


def strict_schema(s):
    """A CRD's structural schema as JSON Schema, strict like the API server's field validation
    (kubectl's default, --validate=strict): an object with declared properties takes no others
    unless it says x-kubernetes-preserve-unknown-fields; `nullable` allows null. (CEL rules,
    x-kubernetes-validations, are not evaluated.)"""
    if isinstance(s, list):
        return [strict_schema(x) for x in s]
    if not isinstance(s, dict):
        return s
    s = {k: strict_schema(v) for k, v in s.items()}
    if s.get("nullable") and "type" in s:
        s["type"] = [s["type"], "null"]
    if "properties" in s and "additionalProperties" not in s and not s.get("x-kubernetes-preserve-unknown-fields"):
        s["additionalProperties"] = False
    return s


@pytest.fixture(scope="session")
def crd_validators(tools):
    out = {}
    for (group, kind), folder in CUSTOM_KINDS.items():
        f = Path(tools[folder]) / f"{group}_{kind.lower()}s.yaml"
        assert f.is_file(), f"no CRD for {kind}: {f}"
        crd = yaml.load(f.read_text(), Loader=CrdLoader)
        assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == kind
        for v in crd["spec"]["versions"]:
            out[(f"{group}/{v['name']}", kind)] = jsonschema.Draft7Validator(strict_schema(v["schema"]["openAPIV3Schema"]))
    return out


def crd_errors(validators, doc):
    v = validators[(doc["apiVersion"], doc["kind"])]
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in sorted(v.iter_errors(doc), key=lambda e: list(map(str, e.path)))]


def core_errors(doc):
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        return []
    except kubernetes_validate.utils.ValidationError as e:
        return [f"{'.'.join(map(str, e.path))}: {e.message}"]


def is_custom(doc):
    return (doc["apiVersion"].split("/")[0], doc["kind"]) in CUSTOM_KINDS


# --- rendering and validation -----------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_core_object_validates_against_kubernetes(rendered, overlay):
    docs = [d for d in rendered[overlay] if not is_custom(d)]
    problems = {}
    for d in docs:
        try:
            errs = core_errors(d)
        except kubernetes_validate.utils.SchemaNotFoundError as e:
            errs = [e.message]
        if errs:
            problems[f"{d['kind']}/{d['metadata']['name']}"] = errs
    assert problems == {}
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["ConfigMap", "CronJob", "Deployment", "Job", "Namespace", "NetworkPolicy",
                     "PodDisruptionBudget", "Service", "ServiceAccount"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_custom_resource_validates_against_its_operators_crd(rendered, crd_validators, overlay):
    docs = [d for d in rendered[overlay] if is_custom(d)]
    problems = {f"{d['kind']}/{d['metadata']['name']}": errs for d in docs if (errs := crd_errors(crd_validators, d))}
    assert problems == {}
    assert sorted(d["kind"] for d in docs) == ["Cluster", "ObjectStore", "PodMonitor", "PrometheusRule",
                                                "ScheduledBackup", "ServiceMonitor"]


def find(docs, kind, name):
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def test_validators_refuse_wrong_fields(rendered, crd_validators):
    docs = rendered["overlays/production"]
    serve = copy.deepcopy(find(docs, "Deployment", "oml-serve"))
    serve["spec"]["replicas"] = "four"
    assert core_errors(serve) == ["spec.replicas: 'four' is not of type 'integer', 'null'"]
    serve = copy.deepcopy(find(docs, "Deployment", "oml-serve"))
    serve["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/v1/health"
    assert core_errors(serve) == ["spec.template.spec.containers.0.readinessProbe.httpGet: "
                                  "Additional properties are not allowed ('paht' was unexpected)"]
    cron = copy.deepcopy(find(docs, "CronJob", "oml-reconcile"))
    cron["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] = ["3"]
    assert core_errors(cron) == ["spec.jobTemplate.spec.podFailurePolicy.rules.0.onExitCodes.values.0: "
                                 "'3' is not of type 'integer', 'null'"]

    cluster = copy.deepcopy(find(docs, "Cluster", "oml-db"))
    cluster["spec"]["postgresql"]["synchronous"]["number"] = "1"
    cluster["spec"]["postgresql"]["synchronous"]["method"] = "all"
    assert crd_errors(crd_validators, cluster) == [
        "spec.postgresql.synchronous.method: 'all' is not one of ['any', 'first']",
        "spec.postgresql.synchronous.number: '1' is not of type 'integer'"]
    cluster = copy.deepcopy(find(docs, "Cluster", "oml-db"))
    cluster["spec"]["instance"] = cluster["spec"].pop("instances")
    assert crd_errors(crd_validators, cluster) == [
        "spec: 'instances' is a required property",
        "spec: Additional properties are not allowed ('instance' was unexpected)"]
    rule = copy.deepcopy(find(docs, "PrometheusRule", "oml"))
    del rule["spec"]["groups"][0]["rules"][0]["expr"]
    assert crd_errors(crd_validators, rule) == ["spec.groups.0.rules.0: 'expr' is a required property"]
    monitor = copy.deepcopy(find(docs, "ServiceMonitor", "oml"))
    monitor["spec"]["endpoints"][0]["scrapeInterval"] = "30s"
    assert crd_errors(crd_validators, monitor) == [
        "spec.endpoints.0: Additional properties are not allowed ('scrapeInterval' was unexpected)"]


# --- what oml needs of the manifests ----------------------------------------------------------

def pod_specs(docs):
    """{(kind, name): pod spec} of every Deployment, Job and CronJob."""
    out = {}
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            out[(d["kind"], d["metadata"]["name"])] = d["spec"]["template"]["spec"]
        elif d["kind"] == "CronJob":
            out[(d["kind"], d["metadata"]["name"])] = d["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return out


def main_container(spec):
    assert len(spec["containers"]) == 1
    return spec["containers"][0]


def projected_files(spec):
    """{file name in /run/oml/secret-src: (secret, key)} of a pod's projected Secret volume."""
    vols = [v for v in spec["volumes"] if v["name"] == "secret-src"]
    if not vols:
        return {}
    return {i["path"]: (s["secret"]["name"], i["key"])
            for s in vols[0]["projected"]["sources"] for i in s["secret"]["items"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_restricted_and_runs_as_the_images_user(rendered, overlay):
    for (kind, name), spec in pod_specs(rendered[overlay]).items():
        assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID,
                                           "fsGroup": IMAGE_UID, "seccompProfile": {"type": "RuntimeDefault"}}, name
        assert spec["automountServiceAccountToken"] is False, name
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}, (name, c["name"])
            assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"], (name, c["name"])
            assert c["image"].startswith("registry.example.com/oml/oml:"), (name, c["image"])
        # Key files: the Secrets are projected group-readable (0440 + fsGroup) and copied by the
        # init container to a memory emptyDir as this uid with mode 0400, the modes oml's key file
        # check (src/common/secret_file.h) and libpq's pgpass check accept.
        if projected_files(spec):
            init = spec["initContainers"][0]
            assert init["command"] == ["/bin/sh", "-ec", 'for f in /run/oml/secret-src/*; do install -m 0400 "$f" '
                                       '/run/oml/secrets/; done'], name
            vols = {v["name"]: v for v in spec["volumes"]}
            assert vols["secret-src"]["projected"]["defaultMode"] == 0o440, name
            assert vols["secrets"]["emptyDir"]["medium"] == "Memory", name


def test_production_pins_one_image_for_every_container(rendered):
    images = {c["image"] for spec in pod_specs(rendered["overlays/production"]).values()
              for c in spec.get("initContainers", []) + spec["containers"]}
    assert images == {"registry.example.com/oml/oml:1.0.0"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_serve_is_probed_on_health_and_spread_behind_a_service(rendered, overlay):
    docs = rendered[overlay]
    dep = find(docs, "Deployment", "oml-serve")
    assert dep["spec"]["replicas"] == {"base": 2, "overlays/production": 4}[overlay]
    c = main_container(dep["spec"]["template"]["spec"])
    assert c["args"] == ["serve"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": 8470, "metrics": 8471}
    assert c["readinessProbe"]["httpGet"] == {"path": "/v1/health", "port": "http"}
    # Liveness must not follow the database (a PostgreSQL failover must not restart the servers).
    assert c["livenessProbe"]["tcpSocket"] == {"port": "http"}
    assert c["startupProbe"]["tcpSocket"] == {"port": "http"}
    svc = find(docs, "Service", "oml")
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8470, "targetPort": "http"}]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    pdb = find(docs, "PodDisruptionBudget", "oml-serve")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_lake_writers_are_one_active_and_one_standby_replaced_together(rendered, overlay):
    dep = find(rendered[overlay], "Deployment", "oml-lakewriter")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    spec = dep["spec"]["template"]["spec"]
    c = main_container(spec)
    assert c["args"] == ["lakewriter"]
    assert [p["containerPort"] for p in c["ports"]] == [8472]
    anti = spec["affinity"]["podAntiAffinity"]
    if overlay == "base":
        assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    else:
        assert list(anti) == ["requiredDuringSchedulingIgnoredDuringExecution"]
        assert anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == "kubernetes.io/hostname"


def settings(docs):
    """oml.toml of the rendered ConfigMap oml-config and the data of oml-env."""
    cms = {d["metadata"]["name"].rsplit("-", 1)[0]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    return cms["oml-config"]["oml.toml"], cms["oml-env"]


def toml_value(toml, key):
    m = re.search(rf'^{key} = "([^"]*)"', toml, re.M)
    assert m, key
    return m.group(1)


def url_parts(url):
    m = re.fullmatch(r"postgresql://([a-z_]+)@([a-z0-9-]+):5432/oml\?(.*)", url)
    assert m, url
    return m.group(1), m.group(2), dict(kv.split("=", 1) for kv in m.group(3).split("&"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_pod_holds_the_files_its_command_reads_and_no_more(rendered, overlay):
    docs = rendered[overlay]
    toml, _ = settings(docs)
    specs = pod_specs(docs)
    keys = {"signing.key", "signing.key.pub", "signing.key.root.pub", "kek.key", "cursor.key"}
    role_file = {}
    for setting, role in (("database_url", "oml_app"), ("lakewriter_database_url", "oml_lakewriter"),
                          ("reconciler_database_url", "oml_reconciler")):
        user, host, q = url_parts(toml_value(toml, setting))
        # CloudNativePG's primary Service, TLS verified against its CA, the password from a file.
        assert (user, host, q["sslmode"], q["sslrootcert"]) == (role, "oml-db-rw", "verify-full", "/run/oml/db-ca/ca.crt")
        assert q["passfile"].startswith("/run/oml/secrets/")
        role_file[role] = Path(q["passfile"]).name
    secret_of_role = {"oml_app": "oml-role-app", "oml_lakewriter": "oml-role-lakewriter",
                      "oml_reconciler": "oml-role-reconciler"}
    # Where each file comes from: (Secret, key).
    source = {"signing.key": ("oml-signing-key", "signing.key"),
              "signing.key.pub": ("oml-signing-key", "signing.key.pub"),
              "signing.key.root.pub": ("oml-signing-key", "signing.key.root.pub"),
              "kek.key": ("oml-kek", "kek.key"), "previous-kek.key": ("oml-kek", "previous-kek.key"),
              "cursor.key": ("oml-cursor-secret", "cursor.key"),
              "postgres.pgpass": ("oml-db-superuser", "pgpass"),
              **{role_file[r]: (secret_of_role[r], "pgpass") for r in role_file}}
    wanted = {
        # serve: all keys, the previous KEK during a rotation, oml_app's password file.
        ("Deployment", "oml-serve"): keys | {"previous-kek.key", role_file["oml_app"]},
        ("Job", "oml-init"): keys | {role_file["oml_app"]},
        # The lake writer signs only materialize-skipped events: no KEK, no cursor secret.
        ("Deployment", "oml-lakewriter"): {"signing.key", "signing.key.pub", "signing.key.root.pub",
                                           role_file["oml_lakewriter"]},
        # Key-less: no signing key, no KEK, no cursor secret.
        ("CronJob", "oml-reconcile"): {role_file["oml_reconciler"]},
        ("CronJob", "oml-reconcile-full"): {role_file["oml_reconciler"]},
        # The superuser's pgpass, nothing else (the role passwords are a volume of their own).
        ("Job", "oml-migrate"): {"postgres.pgpass"},
        ("Deployment", "oml-admin"): keys | {"previous-kek.key"} | set(role_file.values()),
    }
    assert set(specs) == set(wanted)
    for pod, files in wanted.items():
        assert projected_files(specs[pod]) == {f: source[f] for f in files}, pod
    # The reconciler reads S3 with its own read-only credentials, never the deployment's.
    for name in ("oml-reconcile", "oml-reconcile-full"):
        refs = [e.get("secretRef", {}).get("name") for e in main_container(specs[("CronJob", name)])["envFrom"]]
        assert refs == [None, "oml-s3-reconciler"], name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_jobs_run_migrate_init_and_the_reconciler_with_exit_codes_that_end_them(rendered, overlay):
    specs = pod_specs(rendered[overlay])
    migrate = main_container(specs[("Job", "oml-migrate")])["args"]
    assert migrate[:2] == ["migrate", "--admin-url"]
    user, host, q = url_parts(migrate[2])
    assert (user, host, q["passfile"]) == ("postgres", "oml-db-rw", "/run/oml/secrets/postgres.pgpass")
    assert migrate[3:] == ["--app-password-file", "/run/oml/role-passwords/app",
                           "--lakewriter-password-file", "/run/oml/role-passwords/lakewriter",
                           "--reconciler-password-file", "/run/oml/role-passwords/reconciler"]
    # The three role passwords `oml migrate` sets, read once from plain files (no mode check).
    role_passwords = [v for v in specs[("Job", "oml-migrate")]["volumes"] if v["name"] == "role-passwords"][0]
    assert {i["path"]: (s["secret"]["name"], i["key"]) for s in role_passwords["projected"]["sources"]
            for i in s["secret"]["items"]} == {"app": ("oml-role-app", "password"),
                                               "lakewriter": ("oml-role-lakewriter", "password"),
                                               "reconciler": ("oml-role-reconciler", "password")}
    assert main_container(specs[("Job", "oml-init")])["args"] == ["init"]
    assert main_container(specs[("CronJob", "oml-reconcile")])["args"] == ["reconcile"]
    assert main_container(specs[("CronJob", "oml-reconcile-full")])["args"] == ["reconcile", "--full"]
    assert main_container(specs[("Deployment", "oml-admin")])["command"] == ["sleep", "infinity"]
    # Retried only on 5 (unavailable) and 1; src/cli/exit_codes.h names the others.
    fail_on = {}
    for d in rendered[overlay]:
        job = d["spec"]["jobTemplate"]["spec"] if d["kind"] == "CronJob" else d["spec"] if d["kind"] == "Job" else None
        if job:
            rule = job["podFailurePolicy"]["rules"][0]
            assert rule["action"] == "FailJob"
            fail_on[d["metadata"]["name"]] = rule["onExitCodes"]["values"]
    assert fail_on == {"oml-migrate": [2, 4, 6], "oml-init": [2, 3, 6], "oml-reconcile": [2, 3, 4],
                       "oml-reconcile-full": [2, 3, 4]}
    codes = (ROOT / "src" / "cli" / "exit_codes.h").read_text()
    for name, value in (("kExitUsage", 2), ("kExitVerifyFailed", 3), ("kExitPrecondition", 4),
                        ("kExitUnavailable", 5), ("kExitNotFound", 6)):
        assert re.search(rf"\b{name} = {value};", codes), name


def oml_env_names():
    """Every OML_* variable name the sources read."""
    names = set()
    for f in (ROOT / "src").rglob("*.cc"):
        if not f.name.endswith("_test.cc"):
            names |= set(re.findall(r'"(OML_[A-Z0-9_]+)"', f.read_text()))
    return names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_oml_accepts_the_rendered_settings(rendered, overlay, tmp_path):
    toml, env = settings(rendered[overlay])
    known = oml_env_names()
    used = set(env)
    for spec in pod_specs(rendered[overlay]).values():
        used |= {e["name"] for c in spec["containers"] for e in c.get("env", [])}
    assert sorted(n for n in used if n.startswith("OML_") and n not in known) == []
    assert "OML_FAULT" not in used and "OML_REDUCED_DURABILITY" not in used
    # `oml --help` exits 0 only when every setting (oml.toml and environment) is valid.
    (tmp_path / "oml.toml").write_text(toml)
    base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "OML_HOME": str(tmp_path)}
    r = run([OML_BIN, "--help"], env={**base_env, **env})
    assert (r.returncode, r.stderr) == (0, "")
    # ... and refuses an unknown key or an invalid value, naming it (exit 2, usage).
    (tmp_path / "oml.toml").write_text(toml + 'listen_address = "0.0.0.0:8470"\n')
    r = run([OML_BIN, "--help"], env={**base_env, **env})
    assert (r.returncode, r.stderr) == (2, f"oml: invalid-argument: {tmp_path}/oml.toml: unknown setting 'listen_address'\n")
    (tmp_path / "oml.toml").write_text(toml)
    r = run([OML_BIN, "--help"], env={**base_env, **env, "OML_QUARANTINE_BUCKET": "Oml_Quarantine"})
    assert (r.returncode, r.stderr) == (
        2, "oml: invalid-argument: setting quarantine_bucket: not a valid S3 bucket name: 'Oml_Quarantine'\n")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_postgres_is_a_quorum_of_three_that_oml_finds_durable(rendered, overlay):
    cluster = find(rendered[overlay], "Cluster", "oml-db")["spec"]
    assert cluster["instances"] == 3
    # synchronous_standby_names = 'ANY 1 (...)' (the only form oml counts as a quorum) and
    # synchronous_commit left at `on`.
    assert cluster["postgresql"]["synchronous"] == {"method": "any", "number": 1, "dataDurability": "required"}
    assert "synchronous_commit" not in cluster["postgresql"].get("parameters", {})
    assert cluster["bootstrap"]["initdb"]["database"] == "oml"
    assert cluster["enableSuperuserAccess"] is True
    assert cluster["affinity"]["podAntiAffinityType"] == "required"
    # The lake writer's lease needs a direct session: no Pooler in front of PostgreSQL.
    assert not [d for d in rendered[overlay] if d["kind"] == "Pooler"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_keep_metrics_and_postgres_private(rendered, overlay):
    pols = {d["metadata"]["name"]: d["spec"] for d in rendered[overlay] if d["kind"] == "NetworkPolicy"}
    assert pols["default-deny-ingress"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert pols["oml-serve"]["ingress"] == [
        {"ports": [{"port": 8470, "protocol": "TCP"}]},
        {"from": monitoring, "ports": [{"port": 8471, "protocol": "TCP"}]}]
    assert pols["oml-lakewriter"]["ingress"] == [{"from": monitoring, "ports": [{"port": 8472, "protocol": "TCP"}]}]
    db = pols["oml-db"]
    assert db["podSelector"] == {"matchLabels": {"cnpg.io/cluster": "oml-db"}}
    to_5432 = [r["from"] for r in db["ingress"] if {"port": 5432, "protocol": "TCP"} in r["ports"]]
    assert to_5432 == [[{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "oml"}}}],
                       [{"podSelector": {"matchLabels": {"cnpg.io/cluster": "oml-db"}}}],
                       [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "cnpg-system"}},
                         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "cloudnative-pg"}}}]]
    # Every oml pod carries the label the database admits; nothing else of this namespace does.
    for (kind, name), spec in pod_specs(rendered[overlay]).items():
        d = find(rendered[overlay], kind, name)
        tmpl = d["spec"]["jobTemplate"]["spec"]["template"] if kind == "CronJob" else d["spec"]["template"]
        assert tmpl["metadata"]["labels"]["app.kubernetes.io/name"] == "oml", name


def oml_metric_names():
    """The series oml registers (src/common/metrics.cc), histograms with their suffixes, and the
    reconciler's textfile series (src/reconcile/reconcile.cc)."""
    src = (ROOT / "src" / "common" / "metrics.cc").read_text()
    names = set()
    for m in re.finditer(r'Build(Counter|Gauge|Histogram)\(\)\s*\.Name\("([a-z_]+)"\)', src):
        kind, name = m.groups()
        names |= {name + s for s in ("_bucket", "_count", "_sum")} if kind == "Histogram" else {name}
    return names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_monitoring_scrapes_both_metrics_listeners_and_alerts_on_real_series(rendered, overlay):
    docs = rendered[overlay]
    sm = find(docs, "ServiceMonitor", "oml")["spec"]
    scraped = [d for d in docs if d["kind"] == "Service"
               and sm["selector"]["matchLabels"].items() <= d["metadata"].get("labels", {}).items()]
    assert sorted((s["metadata"]["name"], s["spec"]["ports"][0]["port"], s["spec"]["clusterIP"]) for s in scraped) == [
        ("oml-lakewriter-metrics", 8472, "None"), ("oml-serve-metrics", 8471, "None")]
    assert [e["port"] for e in sm["endpoints"]] == ["metrics"]
    assert all(s["spec"]["ports"][0]["name"] == "metrics" for s in scraped)

    rules = [r for g in find(docs, "PrometheusRule", "oml")["spec"]["groups"] for r in g["rules"]]
    known = oml_metric_names()
    assert "oml_durability_quorum" in known and "oml_lake_position" in known
    used = {n for r in rules for n in re.findall(r"\b(oml_[a-z0-9_]+)", r["expr"])}
    assert sorted(used - known) == [], "alerts on series oml does not export"
    others = {n for r in rules for n in re.findall(r"\b([a-z_]+)\{", r["expr"]) if not n.startswith("oml_")}
    assert others == {"up", "kube_job_status_failed"}
    # The chain-integrity kinds the alerts name are the ones the code counts.
    kinds = set()
    for f in (ROOT / "src").rglob("*.cc"):
        kinds |= set(re.findall(r'ChainIntegrity\("([a-z-]+)"\)', f.read_text()))
    assert {k for r in rules for k in re.findall(r'kind="([a-z-]+)"', r["expr"])
            if "chain_integrity" in r["expr"]} <= kinds == {"fork-refused", "publish-refused", "head-invalid"}
    # Each alert on a series every oml process registers names the Service whose process sets it.
    for r in rules:
        if re.search(r"oml_(durability|lake_position|lake_retries|lake_dead_letters)", r["expr"]):
            assert 'service="oml-' in r["expr"], r["alert"]
    assert sorted(r["alert"] for r in rules) == sorted(
        re.findall(r"^\| `(Oml[A-Za-z]+)` \|", (ROOT / "docs/operations/kubernetes.md").read_text(), re.M)), \
        "every alert is explained in docs/operations/kubernetes.md, and nothing else is"


# --- the Secrets ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def made_secrets(tmp_path_factory, tools):
    if not shutil.which("openssl"):
        pytest.skip("deploy/kubernetes/secrets/make-secrets.sh needs the openssl command, which is not installed")
    out = tmp_path_factory.mktemp("secrets") / "oml-secrets"
    r = run([str(MAKE_SECRETS), str(out)])
    assert r.returncode == 0, r.stderr
    return out, kustomize_build(tools, out)


def referenced_secrets(docs):
    """{secret name: {keys}} every rendered object reads (None: the whole Secret, as env)."""
    refs = {}

    def add(name, key):
        refs.setdefault(name, set()).add(key)

    for spec in pod_specs(docs).values():
        for v in spec["volumes"]:
            if "secret" in v:
                for i in v["secret"]["items"]:
                    add(v["secret"]["secretName"], i["key"])
            for s in v.get("projected", {}).get("sources", []):
                # An optional source (the previous KEK, during a rotation only) need not exist.
                for i in [] if s["secret"].get("optional") else s["secret"]["items"]:
                    add(s["secret"]["name"], i["key"])
        for c in spec["containers"]:
            for e in c.get("envFrom", []):
                if "secretRef" in e:
                    add(e["secretRef"]["name"], None)
    for d in docs:
        if d["kind"] == "ObjectStore":
            for ref in d["spec"]["configuration"]["s3Credentials"].values():
                add(ref["name"], ref["key"])
    return refs


def test_make_secrets_makes_every_secret_the_manifests_read(rendered, made_secrets):
    out, secrets = made_secrets
    assert [core_errors(s) for s in secrets] == [[]] * len(secrets)
    made = {s["metadata"]["name"]: set(s["data"]) for s in secrets}
    assert {s["metadata"]["namespace"] for s in secrets} == {"oml"}
    # What CloudNativePG makes for the Cluster oml-db (its docs: applications.md, certificates.md).
    made["oml-db-superuser"] = {"username", "password", "pgpass", "uri"}
    made["oml-db-ca"] = {"ca.crt", "ca.key"}
    for overlay in OVERLAYS:
        refs = referenced_secrets(rendered[overlay])
        assert sorted(set(refs) - set(made)) == [], overlay
        missing_keys = {n: sorted(k for k in keys - made[n] if k is not None) for n, keys in refs.items()}
        assert {n: k for n, k in missing_keys.items() if k} == {}, overlay
    # The S3 credentials are placeholders for the operator; nothing else is.
    assert sorted(f.name for f in out.glob("*.env")) == ["db-backup-s3.env", "s3-reconciler.env", "s3.env"]
    for f in out.glob("*.env"):
        values = [line.split("=", 1)[1] for line in f.read_text().splitlines() if line and not line.startswith("#")]
        assert values and set(values) == {"REPLACE_ME"}, f.name
    assert oct(out.stat().st_mode & 0o777) == "0o700"
    assert {oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {"0o600"}


def test_make_secrets_writes_keys_in_the_formats_oml_reads(rendered, made_secrets):
    out, _ = made_secrets
    # `oml key public` loads signing.key (its file check passes: 0600, ours) and prints the same
    # public key document as signing.key.pub and signing.key.root.pub.
    r = run([OML_BIN, "key", "public"], env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(out),
                                               "OML_HOME": str(out), "OML_SIGNING_KEY": str(out / "signing.key")})
    assert r.returncode == 0, r.stderr
    public = json.loads(r.stdout)
    assert json.loads((out / "signing.key.pub").read_text()) == public
    assert (out / "signing.key.root.pub").read_text() == (out / "signing.key.pub").read_text()
    assert re.fullmatch(r"ed25519:[0-9a-f]{16}", public["key_id"])
    assert re.fullmatch(r"[0-9a-f]{64}\n", (out / "kek.key").read_text())
    lines = [x for x in (out / "cursor.key").read_text().splitlines() if x and not x.startswith("#")]
    assert len(lines) == 1 and re.fullmatch(r"k[0-9a-f]{8} [0-9a-f]{64}", lines[0])
    # pgpass lines for exactly the users of the URLs that read them.
    toml, _ = settings(rendered["base"])
    for setting, role in (("database_url", "app"), ("lakewriter_database_url", "lakewriter"),
                          ("reconciler_database_url", "reconciler")):
        user, _, q = url_parts(toml_value(toml, setting))
        password = (out / f"{role}.password").read_text().strip()
        assert (out / f"{role}.pgpass").read_text() == f"*:*:oml:{user}:{password}\n"
        assert re.fullmatch(r"[0-9a-f]{48}", password)
    # Never over existing keys.
    r = run([str(MAKE_SECRETS), str(out)])
    assert r.returncode == 1 and "refusing to generate keys over existing ones" in r.stderr


# --- the runbook ---------------------------------------------------------------------------------

RUNBOOK = ROOT / "docs" / "operations" / "kubernetes.md"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_belongs_to_a_step_of_the_install(rendered, overlay):
    components = {d["metadata"].get("labels", {}).get("app.kubernetes.io/component") for d in rendered[overlay]}
    assert components == {"setup", "network", "database", "migrate", "init", "serve", "lakewriter",
                          "reconcile", "admin", "monitoring"}
    text = RUNBOOK.read_text()
    # The ordered steps select by that label; the last one applies everything.
    steps = re.findall(r"^apply ([a-z,]+)$", text, re.M)
    assert steps == ["setup,network", "database", "migrate", "init"]
    assert 'kubectl apply -f oml.yaml -l "app.kubernetes.io/component in ($1)"' in text


def test_the_runbooks_manifests_validate(rendered, crd_validators):
    blocks = re.findall(r"^```yaml\n(.*?)^```", RUNBOOK.read_text(), re.S | re.M)
    docs = [d for b in blocks for d in yaml.safe_load_all(b) if d]
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [("Cluster", "oml-db")]
    restore = docs[0]
    assert crd_errors(crd_validators, restore) == []
    # The restored cluster keeps what oml needs of the base's: the quorum, TLS only, the version.
    base = find(rendered["overlays/production"], "Cluster", "oml-db")["spec"]
    for field in ("instances", "imageName", "enableSuperuserAccess", "affinity", "storage", "walStorage"):
        assert restore["spec"][field] == base[field], field
    for field in ("synchronous", "pg_hba"):
        assert restore["spec"]["postgresql"][field] == base["postgresql"][field], field
    assert restore["spec"]["externalClusters"][0]["plugin"]["parameters"] == {
        "barmanObjectName": "oml-db-backups", "serverName": "oml-db"}
