// tlogcheck verifies what oml publishes with implementations no one at oml wrote (issue 23):
// golang.org/x/mod/sumdb/note (signed notes), golang.org/x/mod/sumdb/tlog (RFC 6962 proofs and
// tiles) and github.com/transparency-dev/formats (C2SP checkpoints, tlog-proof, cosignature/v1).
//
// It reads one JSON job on stdin and writes one JSON verdict on stdout, one field per check,
// "ok" or the error the module gave. tests/test_tlog.py builds and runs it.
//
//	{"vkey": "<origin>+<hash>+<key>", "origin": "...",
//	 "checkpoint": "<signed note>",
//	 "inclusion": [{"proof": "<c2sp tlog-proof>", "entry": "<base64 signed_bytes>"}],
//	 "consistency": [{"old": "<signed note>", "new": "<signed note>", "hashes": ["<base64>"]}],
//	 "tiles_dir": "<dir holding checkpoint and tile/...>",
//	 "cosigned": "<note with cosignatures>", "cosigner_vkeys": ["..."]}
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/transparency-dev/formats/log"
	fnote "github.com/transparency-dev/formats/note"
	"github.com/transparency-dev/formats/proof"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

type job struct {
	Vkey        string `json:"vkey"`
	Origin      string `json:"origin"`
	Checkpoint  string `json:"checkpoint"`
	Inclusion   []struct {
		Proof string `json:"proof"`
		Entry string `json:"entry"`
	} `json:"inclusion"`
	Consistency []struct {
		Old    string   `json:"old"`
		New    string   `json:"new"`
		Hashes []string `json:"hashes"`
	} `json:"consistency"`
	TilesDir      string   `json:"tiles_dir"`
	Cosigned      string   `json:"cosigned"`
	CosignerVkeys []string `json:"cosigner_vkeys"`
}

type verdict struct {
	Checkpoint  string   `json:"checkpoint"`
	Inclusion   []string `json:"inclusion"`
	Consistency []string `json:"consistency"`
	Tiles       string   `json:"tiles"`
	Cosigned    string   `json:"cosigned"`
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// openCheckpoint opens a signed checkpoint with both modules: x/mod's note.Open and formats'
// log.ParseCheckpoint (origin and body rules).
func openCheckpoint(v note.Verifier, origin, text string) (*log.Checkpoint, error) {
	if _, err := note.Open([]byte(text), note.VerifierList(v)); err != nil {
		return nil, fmt.Errorf("note.Open: %w", err)
	}
	cp, _, _, err := log.ParseCheckpoint([]byte(text), origin, v)
	if err != nil {
		return nil, fmt.Errorf("log.ParseCheckpoint: %w", err)
	}
	return cp, nil
}

func hashOf(b []byte) (tlog.Hash, error) {
	var h tlog.Hash
	if len(b) != len(h) {
		return h, fmt.Errorf("hash of %d bytes", len(b))
	}
	copy(h[:], b)
	return h, nil
}

// dirTiles reads C2SP tlog-tiles paths (tile/<L>/<N>[.p/<W>], no height element) from a directory.
type dirTiles struct{ dir string }

func (d dirTiles) Height() int { return 8 }

func (d dirTiles) ReadTiles(tiles []tlog.Tile) ([][]byte, error) {
	out := make([][]byte, len(tiles))
	for i, t := range tiles {
		// x/mod's path is tile/<H>/<L>/<N>[.p/<W>]: drop the height element for C2SP's.
		p := strings.Replace(t.Path(), "tile/8/", "tile/", 1)
		if t.L == -1 {
			p = strings.Replace(p, "tile/data/", "tile/entries/", 1)
		}
		b, err := os.ReadFile(filepath.Join(d.dir, filepath.FromSlash(p)))
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

func (d dirTiles) SaveTiles([]tlog.Tile, [][]byte) {}

// checkTiles: every tile the tree of the published checkpoint needs is read through x/mod's
// TileHashReader, which verifies each one against the checkpoint's root; then every entry
// bundle's entries hash to the verified leaf hashes.
func checkTiles(v note.Verifier, origin, dir string) error {
	text, err := os.ReadFile(filepath.Join(dir, "checkpoint"))
	if err != nil {
		return err
	}
	cp, err := openCheckpoint(v, origin, string(text))
	if err != nil {
		return err
	}
	root, err := hashOf(cp.Hash)
	if err != nil {
		return err
	}
	tree := tlog.Tree{N: int64(cp.Size), Hash: root}
	tr := dirTiles{dir}
	hr := tlog.TileHashReader(tree, tr)
	th, err := tlog.TreeHash(tree.N, hr)
	if err != nil {
		return fmt.Errorf("TreeHash: %w", err)
	}
	if th != root {
		return fmt.Errorf("tiles give root %x, the checkpoint %x", th, root)
	}
	for start := int64(0); start < tree.N; start += 256 {
		w := tree.N - start
		if w > 256 {
			w = 256
		}
		t := tlog.Tile{H: 8, L: -1, N: start / 256, W: int(w)}
		data, err := tr.ReadTiles([]tlog.Tile{t})
		if err != nil {
			return fmt.Errorf("entry bundle %d: %w", t.N, err)
		}
		idx := make([]int64, w)
		for i := range idx {
			idx[i] = tlog.StoredHashIndex(0, start+int64(i))
		}
		leaves, err := hr.ReadHashes(idx)
		if err != nil {
			return fmt.Errorf("leaf hashes %d..: %w", start, err)
		}
		b := data[0]
		for i := int64(0); i < w; i++ {
			if len(b) < 2 {
				return fmt.Errorf("entry bundle %d: entry %d truncated", t.N, i)
			}
			n := int(binary.BigEndian.Uint16(b))
			if len(b) < 2+n {
				return fmt.Errorf("entry bundle %d: entry %d truncated", t.N, i)
			}
			if tlog.RecordHash(b[2:2+n]) != leaves[i] {
				return fmt.Errorf("entry %d does not hash to its leaf", start+i)
			}
			b = b[2+n:]
		}
		if len(b) != 0 {
			return fmt.Errorf("entry bundle %d: %d bytes after its entries", t.N, len(b))
		}
	}
	return nil
}

func checkInclusion(v note.Verifier, origin, text, entryB64 string) error {
	var p proof.TLogProof
	if err := p.Unmarshal([]byte(text)); err != nil {
		return fmt.Errorf("TLogProof.Unmarshal: %w", err)
	}
	cp, err := openCheckpoint(v, origin, string(p.Checkpoint))
	if err != nil {
		return err
	}
	entry, err := base64.StdEncoding.DecodeString(entryB64)
	if err != nil {
		return err
	}
	root, err := hashOf(cp.Hash)
	if err != nil {
		return err
	}
	rp := make(tlog.RecordProof, len(p.Hashes))
	for i, h := range p.Hashes {
		rp[i] = tlog.Hash(h)
	}
	return tlog.CheckRecord(rp, int64(cp.Size), root, int64(p.Index), tlog.RecordHash(entry))
}

func checkConsistency(v note.Verifier, origin, oldText, newText string, hashes []string) error {
	o, err := openCheckpoint(v, origin, oldText)
	if err != nil {
		return err
	}
	n, err := openCheckpoint(v, origin, newText)
	if err != nil {
		return err
	}
	tp := make(tlog.TreeProof, len(hashes))
	for i, s := range hashes {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return err
		}
		if tp[i], err = hashOf(b); err != nil {
			return err
		}
	}
	oh, err := hashOf(o.Hash)
	if err != nil {
		return err
	}
	nh, err := hashOf(n.Hash)
	if err != nil {
		return err
	}
	return tlog.CheckTree(tp, int64(n.Size), nh, int64(o.Size), oh)
}

// checkCosigned: the log's signature and every cosigner's cosignature/v1 verify (formats).
func checkCosigned(v note.Verifier, text string, vkeys []string) error {
	vs := []note.Verifier{v}
	for _, k := range vkeys {
		cv, err := fnote.NewVerifierForCosignatureV1(k)
		if err != nil {
			return fmt.Errorf("NewVerifierForCosignatureV1: %w", err)
		}
		vs = append(vs, cv)
	}
	n, err := note.Open([]byte(text), note.VerifierList(vs...))
	if err != nil {
		return err
	}
	if len(n.Sigs) != len(vs) {
		return fmt.Errorf("%d of %d signatures verified", len(n.Sigs), len(vs))
	}
	return nil
}

func main() {
	var j job
	dec := json.NewDecoder(os.Stdin)
	if err := dec.Decode(&j); err != nil {
		fmt.Fprintln(os.Stderr, "tlogcheck: bad job:", err)
		os.Exit(2)
	}
	v, err := note.NewVerifier(j.Vkey)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tlogcheck: bad vkey:", err)
		os.Exit(2)
	}
	var out verdict
	if j.Checkpoint != "" {
		_, err := openCheckpoint(v, j.Origin, j.Checkpoint)
		out.Checkpoint = errText(err)
	}
	for _, in := range j.Inclusion {
		out.Inclusion = append(out.Inclusion, errText(checkInclusion(v, j.Origin, in.Proof, in.Entry)))
	}
	for _, c := range j.Consistency {
		out.Consistency = append(out.Consistency, errText(checkConsistency(v, j.Origin, c.Old, c.New, c.Hashes)))
	}
	if j.TilesDir != "" {
		out.Tiles = errText(checkTiles(v, j.Origin, j.TilesDir))
	}
	if j.Cosigned != "" {
		out.Cosigned = errText(checkCosigned(v, j.Cosigned, j.CosignerVkeys))
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(out)
	os.Stdout.Write(buf.Bytes())
}
