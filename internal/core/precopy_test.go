package core

import (
	"context"
	"strings"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
)

// precopyScript holds 32 MiB of random bytes and keeps changing them,
// a page at a time, counting the changes: on /tmp/ask it undoes them
// on a copy and writes whether the bytes are still those it started
// with (so a page that reached the target from before a change, a stale
// pre-copied one, shows).
const precopyScript = `import hashlib, os, time
n = 32 << 20
b = bytearray(os.urandom(n))
h0 = hashlib.sha256(b).hexdigest()
k = 0
open('/tmp/ready', 'w').close()
while True:
    b[(k * 4096) % n] ^= 0x5a
    k += 1
    if os.path.exists('/tmp/ask'):
        c = bytearray(b)
        for i in range(k):
            c[(i * 4096) % n] ^= 0x5a
        ok = hashlib.sha256(c).hexdigest() == h0
        os.remove('/tmp/ask')
        with open('/tmp/verdict', 'w') as f:
            f.write('%s %d' % ('same' if ok else 'changed', k))
    time.sleep(0.001)
`

// TestMigratePrecopy: a migration of a sandbox with no full checkpoint
// sends its memory to the store before freezing it, and the process on
// the target has every page as it was at the freeze, though the pages
// kept changing during the pre-copy.
func TestMigratePrecopy(t *testing.T) {
	bucket := testBucket(t)
	m, second := trustingHosts(t, bucket)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := pythonSandbox(t, m, precopyScript)
	m2 := second()
	mg, err := m.Migrate(ctx, sb.ID, managerTarget{m2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pre-copy sent %d bytes in %.0f ms; down %.0f ms (upload %.0f ms, target's resume %.0f ms)",
		mg.PrecopySentBytes, mg.PrecopyMS, mg.DowntimeMS, mg.UploadMS, mg.ResumeMS)
	if mg.PrecopySentBytes < 24<<20 {
		t.Fatalf("pre-copy sent %d bytes of a 32 MiB random heap", mg.PrecopySentBytes)
	}
	run(t, m2, sb.ID, "touch /tmp/ask")
	verdict := waitFile(t, m2, sb.ID, "/tmp/verdict")
	if !strings.HasPrefix(verdict, "same ") {
		t.Fatalf("the process on the target: %q", verdict)
	}
	if got, err := m2.Sandbox(ctx, sb.ID); err != nil || got.State != v1.StateRunning {
		t.Fatalf("the target: %+v, %v", got, err)
	}
}
