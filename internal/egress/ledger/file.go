package ledger

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strconv"
	"time"
)

// The file of a sandbox is a sequence of lines, each
//
//	<crc32c of the JSON, 8 lower-case hex digits> <JSON>\n
//
// and the JSON one of
//
//	{"op":"rec","rec":Record}          a record appended; the head moves to it
//	{"op":"fin","id":ID,"state":...}  a pending record finished
//	{"op":"head","head":ID}            the head moved (rewind, fork); "" = start
//	{"op":"use","id":ID,"consumer":..} someone acted on a record
//	{"op":"undo","id":ID,"compensator":...}  a compensator given after the fact
//	{"op":"comp","id":ID,"compensation":...} a compensation's next step
//
// Every line is written with one write(2) on an O_APPEND descriptor, so a
// crash leaves at most the last line torn. encoding/json never writes a
// raw newline, so lines split on '\n'.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// entry is one line's JSON.
type entry struct {
	Op       string    `json:"op"`
	Rec      *Record   `json:"rec,omitempty"`
	ID       string    `json:"id,omitempty"`
	State    State     `json:"state,omitempty"`
	Response *Response `json:"response,omitempty"`
	Error    string    `json:"error,omitempty"`
	Finished time.Time `json:"finished,omitzero"`
	// Head is a pointer so that a rewind to the start ("") is written.
	Head *string `json:"head,omitempty"`
	// Consumer of record ID (op use).
	Consumer *Consumer `json:"consumer,omitempty"`
	// Compensator given to record ID after the fact (op undo), and the
	// new state of its compensation (op comp).
	Compensator  *Compensator  `json:"compensator,omitempty"`
	Compensation *Compensation `json:"compensation,omitempty"`
	// Sealed is the entry's exact payload, sealed (seal.go); the clear
	// fields then hold it redacted.
	Sealed []byte `json:"sealed,omitempty"`
}

const (
	opRec  = "rec"
	opFin  = "fin"
	opHead = "head"
	opUse  = "use"
	opUndo = "undo"
	opComp = "comp"
)

// encodeLine returns e as one line of the file.
func encodeLine(e entry) ([]byte, error) {
	j, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	line := make([]byte, 0, len(j)+10)
	line = fmt.Appendf(line, "%08x ", crc32.Checksum(j, castagnoli))
	line = append(line, j...)
	return append(line, '\n'), nil
}

// decodeLine parses one line without its '\n'.
func decodeLine(line []byte) (entry, error) {
	var e entry
	if len(line) < 10 || line[8] != ' ' {
		return e, errors.New("not a ledger line")
	}
	want, err := strconv.ParseUint(string(line[:8]), 16, 32)
	if err != nil {
		return e, errors.New("bad checksum field")
	}
	j := line[9:]
	if crc32.Checksum(j, castagnoli) != uint32(want) {
		return e, errors.New("checksum mismatch")
	}
	if err := json.Unmarshal(j, &e); err != nil {
		return e, fmt.Errorf("bad JSON: %w", err)
	}
	return e, nil
}

// loadResult is what reading a file found.
type loadResult struct {
	state *state
	// valid is the length of the file's good prefix; when it is shorter
	// than the file, the rest is a torn last line.
	valid, size int64
}

// load reads and folds the file at path, opened as r. A bad last line (no
// '\n', a bad checksum or JSON that does not parse) is a torn append and
// is left out of valid; a bad line before the last one, or a line that
// parses but does not fit the records before it, is an error naming the
// file and line: records are never dropped silently.
func load(path string, r io.Reader, c codec) (loadResult, error) {
	st := newState()
	br := bufio.NewReaderSize(r, 64<<10)
	var off int64
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if err != nil && err != io.EOF {
			return loadResult{}, fmt.Errorf("read %s: %w", path, err)
		}
		if len(line) == 0 {
			st.rebuild()
			return loadResult{state: st, valid: off, size: off}, nil
		}
		size := off + int64(len(line))
		complete := line[len(line)-1] == '\n'
		var e entry
		var perr error
		if !complete {
			perr = errors.New("no end of line")
		} else {
			e, perr = decodeLine(line[:len(line)-1])
		}
		if perr != nil {
			if _, err := br.Peek(1); err == io.EOF {
				st.rebuild()
				return loadResult{state: st, valid: off, size: size}, nil
			} else if err != nil {
				return loadResult{}, fmt.Errorf("read %s: %w", path, err)
			}
			return loadResult{}, fmt.Errorf("ledger %s line %d: %v (not the last line: the file is corrupt)", path, n, perr)
		}
		// A line that does not open is whole (its checksum held): an
		// error, never a torn line to cut.
		if err := c.open(&e); err != nil {
			return loadResult{}, fmt.Errorf("ledger %s line %d: %w", path, n, err)
		}
		if err := st.apply(e); err != nil {
			return loadResult{}, fmt.Errorf("ledger %s line %d: %w", path, n, err)
		}
		off = size
	}
}

// apply folds one entry read from the file into st.
func (st *state) apply(e entry) error {
	switch e.Op {
	case opRec:
		if e.Rec == nil {
			return errors.New("rec line without a record")
		}
		return st.check(*e.Rec, true)
	case opFin:
		i, ok := st.byID[e.ID]
		if !ok {
			return fmt.Errorf("finish of unknown record %q", e.ID)
		}
		if st.recs[i].State != Pending {
			return fmt.Errorf("finish of record %s in state %s", e.ID, st.recs[i].State)
		}
		if e.State != Completed && e.State != Failed {
			return fmt.Errorf("finish of record %s to state %q", e.ID, e.State)
		}
		st.finish(i, e.State, e.Response, e.Error, e.Finished)
	case opUse:
		i, ok := st.byID[e.ID]
		if !ok || e.Consumer == nil {
			return fmt.Errorf("consumer of unknown record %q", e.ID)
		}
		st.recs[i].Consumers = append(st.recs[i].Consumers, *e.Consumer)
	case opUndo:
		i, ok := st.byID[e.ID]
		if !ok || e.Compensator == nil {
			return fmt.Errorf("compensator of unknown record %q", e.ID)
		}
		st.recs[i].Compensator = e.Compensator
	case opComp:
		i, ok := st.byID[e.ID]
		if !ok || e.Compensation == nil || !validCompState(e.Compensation.State) {
			return fmt.Errorf("compensation of unknown record %q, or in no known state", e.ID)
		}
		st.compensate(i, *e.Compensation)
	case opHead:
		if e.Head == nil {
			return errors.New("head line without a head")
		}
		if *e.Head != "" {
			if _, ok := st.byID[*e.Head]; !ok {
				return fmt.Errorf("head moved to unknown record %q", *e.Head)
			}
		}
		st.setHead(*e.Head)
	default:
		return fmt.Errorf("unknown op %q", e.Op)
	}
	return nil
}

// writeAll writes lines to f with one write(2) (f is O_APPEND). On a
// short or failed write it cuts the file back to size, so that no torn
// line sits before the next append; torn reports that it could not.
func writeAll(f *os.File, size int64, lines []byte) (torn bool, err error) {
	n, err := f.Write(lines)
	if err == nil && n == len(lines) {
		return false, nil
	}
	if err == nil {
		err = io.ErrShortWrite
	}
	if terr := f.Truncate(size); terr != nil {
		return true, fmt.Errorf("%w (and cutting back the partial line: %v)", err, terr)
	}
	return false, err
}
