package audit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// Head names an entry of the log: its seq and hash. The head of an empty
// log is (0, ZeroHash).
type Head struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

func (h Head) String() string { return fmt.Sprintf("%d:%s", h.Seq, h.Hash) }

// Report is what a verification found.
type Report struct {
	OK       bool
	Entries  int
	FirstSeq uint64 // 0 when empty
	Head     Head   // the last good entry
	// Partial: the first entry's seq is above 1 (an export made with
	// --since); its prev is taken as given.
	Partial bool
	// Segment is the note of a segment's first entry (kind "segment"):
	// the segment before it was set aside as damaged.
	Segment string
	Anchor  *Head // what the log was checked against, nil if nothing
	// For a failure: the first bad entry's seq (the seq the line should
	// have had), its line number (1-based) and what is wrong.
	BadSeq  uint64
	BadLine int
	Problem string
}

// chain checks entries one by one; the zero value expects seq 1 (or, if
// partial is allowed, any first seq).
type chain struct {
	allowPartial bool
	anchor       *Head
	n            int
	first        uint64
	head         Head
	anchorHash   string // the hash of entry anchor.Seq, once seen
	segment      string
}

// add checks one line (without its newline).
func (c *chain) add(line []byte) error {
	e, err := decode(line)
	if err != nil {
		return err
	}
	if c.n == 0 {
		switch {
		case e.Seq == 1 && e.Prev != ZeroHash:
			return fmt.Errorf("first entry's prev is %s, not zeros", short(e.Prev))
		case e.Seq != 1 && !c.allowPartial:
			return fmt.Errorf("the log starts at seq %d, not 1: entries before it were removed", e.Seq)
		case e.Seq == 0:
			return errors.New("seq 0")
		}
		c.first = e.Seq
		if e.Kind == KindSegment {
			c.segment = e.Note
		}
	} else {
		if e.Seq != c.head.Seq+1 {
			if e.Seq > c.head.Seq+1 {
				return fmt.Errorf("seq %d follows seq %d: entries %d-%d are missing", e.Seq, c.head.Seq, c.head.Seq+1, e.Seq-1)
			}
			return fmt.Errorf("seq %d follows seq %d: out of order", e.Seq, c.head.Seq)
		}
		if e.Prev != c.head.Hash {
			return fmt.Errorf("prev %s is not the hash of entry %d (%s): an entry before it was changed, removed or moved", short(e.Prev), c.head.Seq, short(c.head.Hash))
		}
	}
	c.n++
	c.head = Head{Seq: e.Seq, Hash: e.Hash}
	if c.anchor != nil && e.Seq == c.anchor.Seq {
		c.anchorHash = e.Hash
	}
	return nil
}

// checkAnchor compares the whole chain with the anchor.
func (c *chain) checkAnchor() error {
	a := c.anchor
	if a == nil || a.Seq == 0 {
		return nil
	}
	if c.head.Seq < a.Seq {
		return fmt.Errorf("the log ends at seq %d but its anchor names seq %d (%s): entries were cut from the tail", c.head.Seq, a.Seq, short(a.Hash))
	}
	if c.first > a.Seq {
		return nil // a partial export that starts after the anchor
	}
	if c.anchorHash != a.Hash {
		return fmt.Errorf("entry %d hashes to %s, its anchor says %s: the log was rewritten", a.Seq, short(c.anchorHash), short(a.Hash))
	}
	return nil
}

// scanResult is what scan read from a file.
type scanResult struct {
	valid int64 // bytes of good, complete lines
	size  int64
	torn  bool  // the bytes after valid are one last line without its newline
	err   error // damage at line
	line  int
}

// scan reads lines from r into c until the end or the first bad line.
// A last line without its newline is torn (a crash mid-append), not
// damage; a bad line anywhere else is damage.
func scan(r io.Reader, c *chain) scanResult {
	br := bufio.NewReaderSize(r, 64<<10)
	var res scanResult
	for {
		line, err := readLine(br)
		res.size += int64(len(line))
		if len(line) == 0 && err == io.EOF {
			return res
		}
		if err == io.EOF {
			// No newline: a crash in the middle of the write, or the
			// file was cut there.
			res.torn = true
			res.line = c.n + 1
			return res
		}
		if err != nil {
			res.err, res.line = err, c.n+1
			return res
		}
		if aerr := c.add(line[:len(line)-1]); aerr != nil {
			res.err, res.line = aerr, c.n+1
			return res
		}
		res.valid += int64(len(line))
	}
}

// readLine returns the next line with its newline, refusing one over
// MaxLine.
func readLine(br *bufio.Reader) ([]byte, error) {
	var out []byte
	for {
		frag, err := br.ReadSlice('\n')
		out = append(out, frag...)
		if len(out) > MaxLine {
			return out, fmt.Errorf("line over the limit of %d bytes", MaxLine)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return out, err
	}
}

// Verify checks a log read from r (the file, or an export) and, when
// anchor is not nil, that it holds the anchor's entry. An export that
// starts after seq 1 is checked from its first entry.
func Verify(r io.Reader, anchor *Head) Report { return verify(r, anchor, true) }

func verify(r io.Reader, anchor *Head, allowPartial bool) Report {
	c := &chain{allowPartial: allowPartial, anchor: anchor}
	res := scan(r, c)
	rep := Report{Entries: c.n, FirstSeq: c.first, Head: c.head, Partial: c.first > 1, Segment: c.segment, Anchor: anchor}
	if c.n == 0 {
		rep.Head = Head{Hash: ZeroHash}
	}
	switch {
	case res.err != nil:
		rep.Problem = res.err.Error()
	case res.torn:
		rep.Problem = "the last line has no newline: torn by a crash, or cut"
	default:
		if err := c.checkAnchor(); err != nil {
			rep.Problem = err.Error()
			rep.BadSeq = c.head.Seq + 1
			if anchor.Seq < rep.BadSeq {
				rep.BadSeq = anchor.Seq
			}
			return rep
		}
		rep.OK = true
		return rep
	}
	rep.BadSeq = c.head.Seq + 1
	rep.BadLine = c.n + 1
	return rep
}

// lineSeq reads the seq of a line cheaply: every line starts {"seq":N,.
func lineSeq(line []byte) (uint64, bool) {
	rest, ok := bytes.CutPrefix(line, []byte(`{"seq":`))
	if !ok {
		return 0, false
	}
	var n uint64
	i := 0
	for ; i < len(rest) && rest[i] >= '0' && rest[i] <= '9' && i < 20; i++ {
		n = n*10 + uint64(rest[i]-'0')
	}
	return n, i > 0
}
