// Package ledger is the append-only record of every effect a sandbox had
// on the world outside it: HTTP requests, TLS and raw connections, DNS
// lookups, and effects declared through the API. It lives outside the
// sandbox and its checkpoints and only grows, so a rollback cannot erase
// what the world already saw.
//
// Records form lines, as commits form branches: each record points at
// the previous one of its line (Prev), a sandbox's head is the last
// record of its current line, and a checkpoint remembers the head it was
// taken at. Rolling back to a checkpoint rewinds the head; committed
// effects no longer reachable from the head are orphans: the world has
// them, the sandbox's state does not. A request equivalent to an orphan
// is answered from the ledger (a replay record joins the orphan to the
// line) instead of being sent again.
package ledger

import "time"

// Kind classifies a record.
type Kind string

const (
	Read   Kind = "read"   // GET, HEAD, OPTIONS, DNS
	Effect Kind = "effect" // every other HTTP method; declared effects
	Opaque Kind = "opaque" // TLS without inspection, raw TCP or UDP
)

// State is where a record is in its life.
type State string

const (
	Pending   State = "pending"   // recorded, sent or about to be; outcome unknown
	Completed State = "completed" // the world answered
	Failed    State = "failed"    // never reached the world or it failed (Error says)
	Denied    State = "denied"    // refused by the egress policy; never sent
	Blocked   State = "blocked"   // refused as divergent after a rollback; never sent
	Replayed  State = "replayed"  // answered from the orphan ReplayOf; never sent
	Refused   State = "refused"   // equivalent to a pending record; never sent
)

// Identity is what makes two requests the same effect.
type Identity struct {
	Proto  string `json:"proto"` // http, https, tls, tcp, udp, dns, declared
	Method string `json:"method,omitempty"`
	// URL is canonical: lower-case scheme and host, default port
	// dropped, query parameters sorted.
	URL  string `json:"url,omitempty"`
	Host string `json:"host,omitempty"` // name (Host, SNI, DNS question) or address
	Addr string `json:"addr,omitempty"` // ip:port the sandbox connected to
	// BodyHash is the hex SHA-256 of the canonical body (Canon).
	BodyHash string `json:"body_hash,omitempty"`
	// HeaderHash is the hex SHA-256 of the canonical header set: every
	// header but the ignored ones, names lower-cased, sorted.
	HeaderHash     string `json:"header_hash,omitempty"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// Response summarizes what came back.
type Response struct {
	Status    int                 `json:"status,omitempty"`
	Header    map[string][]string `json:"header,omitempty"`
	Body      []byte              `json:"body,omitempty"` // whole when BodySize <= the cap
	BodySize  int64               `json:"body_size"`
	BodyHash  string              `json:"body_hash,omitempty"`
	Truncated bool                `json:"truncated,omitempty"` // Body holds only a prefix
	BytesOut  int64               `json:"bytes_out,omitempty"` // sandbox -> world (connections)
	BytesIn   int64               `json:"bytes_in,omitempty"`  // world -> sandbox
	Answers   []string            `json:"answers,omitempty"`   // DNS
}

// Compensator undoes an effect: an HTTP request (Method, URL, Header,
// Body: a 2xx answer means compensated) or a command run in a helper
// sandbox (Sandbox, Command: exit status 0 means compensated).
type Compensator struct {
	Method  string              `json:"method,omitempty"`
	URL     string              `json:"url,omitempty"`
	Header  map[string][]string `json:"header,omitempty"`
	Body    []byte              `json:"body,omitempty"`
	Sandbox string              `json:"sandbox,omitempty"`
	Command []string            `json:"command,omitempty"`
}

// CompState is where an effect's compensation is.
type CompState string

const (
	// CompPlanned: a rollback that orphans the effect will compensate
	// it; written before the rollback switches the sandbox's state, so
	// a crash past the switch still compensates.
	CompPlanned CompState = "planned"
	// CompRunning: attempt Attempts is being sent (the intent, written
	// before the compensator runs); its outcome is unknown until the
	// next line.
	CompRunning CompState = "compensating"
	// CompRetrying: attempt Attempts failed (Error says why); another
	// follows after a backoff.
	CompRetrying CompState = "retrying"
	// CompDone: the compensator succeeded; the world no longer has the
	// effect.
	CompDone CompState = "compensated"
	// CompFailed: the compensation gave up (Error says why); the world
	// still has the effect, an orphan.
	CompFailed CompState = "failed"
	// CompCancelled: planned, but the rollback did not happen (the
	// effect is not orphaned).
	CompCancelled CompState = "cancelled"
)

// Compensation is the latest state of an effect's compensation; the
// ledger file keeps every step.
type Compensation struct {
	State CompState `json:"state"`
	// Rollback is the checkpoint whose rollback orphaned the effect;
	// Batch names that rollback's compensations (one batch is ordered
	// by its dependencies as a whole).
	Rollback string `json:"rollback,omitempty"`
	Batch    string `json:"batch,omitempty"`
	// Attempts counts the attempts started (the intents written).
	Attempts int       `json:"attempts,omitempty"`
	Error    string    `json:"error,omitempty"`
	At       time.Time `json:"at"`
}

// Open reports whether the compensation is under way: planned, running
// or between attempts. An effect in that state may or may not still be
// in the world.
func (c *Compensation) Open() bool {
	return c != nil && (c.State == CompPlanned || c.State == CompRunning || c.State == CompRetrying)
}

func validCompState(s CompState) bool {
	switch s {
	case CompPlanned, CompRunning, CompRetrying, CompDone, CompFailed, CompCancelled:
		return true
	}
	return false
}

// Consumer is someone who acted on an effect.
type Consumer struct {
	By   string    `json:"by"` // who: a sandbox ID, an agent, a system
	Note string    `json:"note,omitempty"`
	At   time.Time `json:"at"`
}

// Record is one entry of a sandbox's ledger.
type Record struct {
	ID      string `json:"id"`
	Seq     uint64 `json:"seq"`  // 1, 2, ... in the sandbox's ledger
	Prev    string `json:"prev"` // previous record of this record's line; "" at the start
	Sandbox string `json:"sandbox"`
	// Origin is the sandbox that wrote the record when it was inherited
	// by a fork ("" when it is this sandbox's own).
	Origin     string    `json:"origin,omitempty"`
	Turn       int       `json:"turn,omitempty"`
	Checkpoint string    `json:"checkpoint,omitempty"` // the sandbox's head checkpoint then
	Kind       Kind      `json:"kind"`
	State      State     `json:"state"`
	Request    Identity  `json:"request"`
	Response   *Response `json:"response,omitempty"`
	Error      string    `json:"error,omitempty"`
	// ReplayOf is the orphan a Replayed record answered from, or the
	// pending record a Refused one matched.
	ReplayOf string `json:"replay_of,omitempty"`
	Declared bool   `json:"declared,omitempty"`
	// Type is a declared effect's own name for what it is ("payment",
	// "email"): effect policies may name it.
	Type        string       `json:"type,omitempty"`
	Compensator *Compensator `json:"compensator,omitempty"`
	// DependsOn lists the earlier records of the line this effect
	// depends on (compensations run dependents first). nil: it may
	// depend on every earlier record of its line.
	DependsOn    *[]string     `json:"depends_on,omitempty"`
	Compensation *Compensation `json:"compensation,omitempty"`
	// Consumers acted on the effect (another sandbox, an agent, a
	// system): a rollback that would orphan it is refused unless forced
	// or it has a compensator.
	Consumers []Consumer `json:"consumers,omitempty"`
	Started   time.Time  `json:"started"`
	Finished  time.Time  `json:"finished,omitzero"`
}

// Committed reports whether r is an effect the world has (or may have):
// a completed or still pending effect or opaque record of this line.
func (r Record) Committed() bool {
	return (r.Kind == Effect || r.Kind == Opaque) && (r.State == Completed || r.State == Pending)
}

// Compensated reports whether r's compensation succeeded: the world no
// longer has it.
func (r Record) Compensated() bool {
	return r.Compensation != nil && r.Compensation.State == CompDone
}

// live: committed and not compensated, what an orphan is made of.
func (r Record) live() bool { return r.Committed() && !r.Compensated() }
