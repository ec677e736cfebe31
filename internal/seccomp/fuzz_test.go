package seccomp

import (
	"encoding/binary"
	"testing"
)

// FuzzParseOCI: a profile comes from a client (molt create --seccomp
// PATH). Whatever the bytes, parsing and compiling either fail cleanly
// or give a program the kernel would accept whose verdicts are the
// profile's meaning (eval) for calls drawn from the input.
func FuzzParseOCI(f *testing.F) {
	f.Add([]byte(`{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","write","exit_group"],"action":"SCMP_ACT_ALLOW"}]}`), uint32(0), uint64(0))
	f.Add([]byte(`{"defaultAction":"SCMP_ACT_ALLOW","defaultErrnoRet":38,"syscalls":[{"names":["socket"],"action":"SCMP_ACT_ERRNO","errnoRet":1,"args":[{"index":0,"value":17,"op":"SCMP_CMP_EQ"}]}]}`), uint32(41), uint64(17))
	f.Add([]byte(`{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["personality"],"action":"SCMP_ACT_ALLOW","args":[{"index":0,"value":4294967295,"valueTwo":0,"op":"SCMP_CMP_MASKED_EQ"}]},{"names":["clone"],"action":"SCMP_ACT_ALLOW","args":[{"index":0,"value":2114060288,"op":"SCMP_CMP_MASKED_EQ"}],"excludes":{"caps":["CAP_SYS_ADMIN"]}}]}`), uint32(56), uint64(0x10000000))
	f.Add([]byte(`{"defaultAction":"SCMP_ACT_KILL","syscalls":[{"names":["ioctl"],"action":"SCMP_ACT_ALLOW","args":[{"index":1,"value":37888,"op":"SCMP_CMP_LT"}]}]}`), uint32(16), uint64(1))
	f.Fuzz(func(t *testing.T, data []byte, nr uint32, arg uint64) {
		p, err := ParseOCI(data, ParseOptions{Kernel: "6.18.0"})
		if err != nil {
			return
		}
		prog, err := Compile(p)
		if err != nil {
			return
		}
		if len(prog) == 0 || len(prog) > maxInsns {
			t.Fatalf("program of %d instructions", len(prog))
		}
		vm := newVM(t, p)
		// Calls drawn from the input: its number (and a known one near
		// it), the argument in every position, and its halves.
		var args [6]uint64
		for i := range args {
			args[i] = arg
			if i%2 == 1 {
				args[i] = arg >> 32
			}
		}
		known := nr % (MaxSyscall + 1)
		for _, n := range []uint32{nr, known} {
			want := eval(p, n, args)
			if got := run(t, vm, auditArchX86_64, n, args[:]...); got != want {
				var b [8]byte
				binary.LittleEndian.PutUint64(b[:], arg)
				t.Fatalf("call %d with %x: the program says %#x, the profile %#x", n, b, uint32(got), uint32(want))
			}
		}
	})
}
