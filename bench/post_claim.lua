-- wrk script: POST /v1/claims with one of `ntenants` bench tokens ("bench-token-<n>", hashed
-- into oml.api_keys by bench/commit-point). Counts non-201 answers and prints them at the end.
local ntenants = tonumber(os.getenv("BENCH_TENANTS") or "1")
local body = '{"body":"benchmark claim body","workarea_id":"wa","path":"p/a.md","provenance":"agent"}'
local bad = 0
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
  bad = 0
end

function request()
  local n = math.random(1, ntenants)
  return wrk.format("POST", "/v1/claims",
    { ["Authorization"] = "Bearer bench-token-" .. n, ["Content-Type"] = "application/json" }, body)
end

function response(status, headers, b)
  if status ~= 201 then bad = bad + 1 end
end

function done(summary, latency, requests)
  local total_bad = 0
  for _, t in ipairs(threads) do total_bad = total_bad + (t:get("bad") or 0) end
  io.write(string.format("RESULT requests=%d duration_us=%d non201=%d\n",
    summary.requests, summary.duration, total_bad))
end
