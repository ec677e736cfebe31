package seccomp

import (
	"encoding/binary"
	"fmt"
	"slices"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Program is a compiled filter: classic BPF over struct seccomp_data.
type Program []bpf.RawInstruction

const (
	auditArchX86_64 = 0xc000003e // AUDIT_ARCH_X86_64
	x32SyscallBit   = 0x40000000
	maxInsns        = 4096 // BPF_MAXINSNS

	offNr   = 0
	offArch = 4
	offArgs = 16

	opLdAbs = 0x20 // BPF_LD | BPF_W | BPF_ABS
	opAndK  = 0x54 // BPF_ALU | BPF_AND | BPF_K
	opJa    = 0x05 // BPF_JMP | BPF_JA
	opJeq   = 0x15 // BPF_JMP | BPF_JEQ | BPF_K
	opJgt   = 0x25 // BPF_JMP | BPF_JGT | BPF_K
	opJge   = 0x35 // BPF_JMP | BPF_JGE | BPF_K
	opRet   = 0x06 // BPF_RET | BPF_K
)

// MaxSyscall is the highest x86-64 system call number this package
// knows; higher numbers fail with ENOSYS.
var MaxSyscall = func() uint32 {
	var m uint32
	for _, n := range sysnums {
		m = max(m, n)
	}
	return m
}()

// Sysnum returns the x86-64 number of a system call.
func Sysnum(name string) (uint32, bool) {
	n, ok := sysnums[name]
	return n, ok
}

// call is what the profile says about one system call number.
type call struct {
	conds  []Rule  // conditional rules, in profile order
	uncond *Action // the first unconditional rule's action
}

// Compile builds the x86-64 program of p.
func Compile(p *Profile) (Program, error) {
	calls := map[uint32]*call{}
	for _, r := range p.Rules {
		for _, name := range r.Names {
			nr, ok := sysnums[name]
			if !ok {
				continue
			}
			c := calls[nr]
			if c == nil {
				c = &call{}
				calls[nr] = c
			}
			if len(r.Conds) > 0 {
				c.conds = append(c.conds, r)
			} else if c.uncond == nil {
				a := r.Action
				c.uncond = &a
			}
		}
	}
	// Segments of consecutive numbers with one plain action, or one
	// number with conditional rules (conds set).
	type seg struct {
		start  uint32
		action Action
		c      *call
	}
	var segs []seg
	for nr := uint32(0); nr <= MaxSyscall; nr++ {
		s := seg{start: nr, action: p.Default}
		if c := calls[nr]; c != nil {
			if c.uncond != nil {
				s.action = *c.uncond
			}
			if len(c.conds) > 0 {
				s.c = c
			}
		}
		if n := len(segs); n > 0 && s.c == nil && segs[n-1].c == nil && segs[n-1].action == s.action {
			continue
		}
		segs = append(segs, s)
	}

	var a asm
	kill, enosys := a.newLabel(), a.newLabel()
	a.ld(offArch)
	a.jmp(opJeq, auditArchX86_64, next, kill)
	a.ld(offNr)
	a.jmp(opJge, x32SyscallBit, kill, next)
	a.jmp(opJgt, MaxSyscall, enosys, next)
	var search func(s []seg)
	search = func(s []seg) {
		if len(s) == 1 {
			if s[0].c == nil {
				a.ret(s[0].action)
				return
			}
			fallback := p.Default
			if s[0].c.uncond != nil {
				fallback = *s[0].c.uncond
			}
			for _, r := range s[0].c.conds {
				fail := a.newLabel()
				for _, c := range r.Conds {
					a.cond(c, fail)
				}
				a.ret(r.Action)
				a.place(fail)
			}
			a.ret(fallback)
			return
		}
		mid := len(s) / 2
		right := a.newLabel()
		a.jmp(opJge, s[mid].start, right, next)
		search(s[:mid])
		a.place(right)
		search(s[mid:])
	}
	search(segs)
	a.place(kill)
	a.ret(ActKillProcess)
	a.place(enosys)
	a.ret(ActErrno(unix.ENOSYS))
	prog, err := a.link()
	if err != nil {
		return nil, err
	}
	if len(prog) > maxInsns {
		return nil, fmt.Errorf("seccomp: program of %d instructions, more than %d", len(prog), maxInsns)
	}
	return prog, nil
}

// cond emits a test of c that falls through when c holds and jumps to
// fail otherwise. Arguments are little-endian 64-bit words.
func (a *asm) cond(c Cond, fail int) {
	lo, hi := uint32(offArgs+8*c.Index), uint32(offArgs+8*c.Index+4)
	vl, vh := uint32(c.Value), uint32(c.Value>>32)
	pass := a.newLabel()
	switch c.Op {
	case OpEQ:
		a.ld(hi)
		a.jmp(opJeq, vh, next, fail)
		a.ld(lo)
		a.jmp(opJeq, vl, next, fail)
	case OpNE:
		a.ld(hi)
		a.jmp(opJeq, vh, next, pass)
		a.ld(lo)
		a.jmp(opJeq, vl, fail, next)
	case OpGT, OpGE:
		op := uint16(opJgt)
		if c.Op == OpGE {
			op = opJge
		}
		a.ld(hi)
		a.jmp(opJgt, vh, pass, next)
		a.jmp(opJeq, vh, next, fail)
		a.ld(lo)
		a.jmp(op, vl, next, fail)
	case OpLT, OpLE: // not GE, not GT
		op := uint16(opJge)
		if c.Op == OpLE {
			op = opJgt
		}
		a.ld(hi)
		a.jmp(opJgt, vh, fail, next)
		a.jmp(opJeq, vh, next, pass)
		a.ld(lo)
		a.jmp(op, vl, fail, next)
	case OpMaskedEQ, OpMaskedNE:
		ml, mh := uint32(c.Value), uint32(c.Value>>32)
		wl, wh := uint32(c.ValueTwo), uint32(c.ValueTwo>>32)
		if c.Op == OpMaskedEQ {
			if mh != 0 || wh != 0 {
				a.ld(hi)
				a.and(mh)
				a.jmp(opJeq, wh, next, fail)
			}
			a.ld(lo)
			a.and(ml)
			a.jmp(opJeq, wl, next, fail)
		} else {
			if mh != 0 || wh != 0 {
				a.ld(hi)
				a.and(mh)
				a.jmp(opJeq, wh, next, pass)
			}
			a.ld(lo)
			a.and(ml)
			a.jmp(opJeq, wl, fail, next)
		}
	default:
		panic(fmt.Sprintf("seccomp: unknown op %d", c.Op))
	}
	a.place(pass)
}

// asm assembles instructions whose jumps name labels. Conditional jumps
// reach 255 instructions; link puts an unconditional jump next to any
// that must reach further.
type asm struct {
	nodes  []node
	labels int
}

// next as a jump target: the following instruction.
const next = -1

type node struct {
	ins    bpf.RawInstruction
	jt, jf int // labels, or next
	label  int // >= 0: this node only marks the label's place
}

func (a *asm) newLabel() int { a.labels++; return a.labels - 1 }

func (a *asm) emit(op uint16, k uint32, jt, jf int) {
	a.nodes = append(a.nodes, node{ins: bpf.RawInstruction{Op: op, K: k}, jt: jt, jf: jf, label: -1})
}
func (a *asm) ld(off uint32)  { a.emit(opLdAbs, off, next, next) }
func (a *asm) and(k uint32)   { a.emit(opAndK, k, next, next) }
func (a *asm) ret(act Action) { a.emit(opRet, uint32(act), next, next) }
func (a *asm) place(l int) {
	a.nodes = append(a.nodes, node{label: l, jt: next, jf: next})
}
func (a *asm) jmp(op uint16, k uint32, jt, jf int) { a.emit(op, k, jt, jf) }

func (a *asm) link() (Program, error) {
	for {
		pos := make([]int, a.labels)
		at := make([]int, len(a.nodes))
		n := 0
		for i, nd := range a.nodes {
			at[i] = n
			if nd.label >= 0 {
				pos[nd.label] = n
			} else {
				n++
			}
		}
		fixed := true
		for i := 0; i < len(a.nodes); i++ {
			nd := a.nodes[i]
			if nd.label >= 0 || nd.ins.Op == opJa || nd.ins.Op&0x07 != 0x05 {
				continue
			}
			far := func(l int) bool { return l != next && pos[l]-at[i]-1 > 255 }
			if !far(nd.jt) && !far(nd.jf) {
				continue
			}
			// Route each far target through a ja placed right after.
			var tramp []node
			for _, t := range []*int{&a.nodes[i].jt, &a.nodes[i].jf} {
				if far(*t) {
					l := a.newLabel()
					tramp = append(tramp, node{label: l, jt: next, jf: next},
						node{ins: bpf.RawInstruction{Op: opJa}, jt: *t, jf: next, label: -1})
					*t = l
				}
			}
			// Whatever fell through to the next instruction must
			// still reach it: jump over the trampolines.
			after := a.newLabel()
			for _, t := range []*int{&a.nodes[i].jt, &a.nodes[i].jf} {
				if *t == next {
					*t = after
				}
			}
			tramp = append(tramp, node{label: after, jt: next, jf: next})
			a.nodes = slices.Insert(a.nodes, i+1, tramp...)
			fixed = false
			break
		}
		if !fixed {
			continue
		}
		prog := make(Program, 0, n)
		for i, nd := range a.nodes {
			if nd.label >= 0 {
				continue
			}
			ins := nd.ins
			off := func(l int) (uint32, error) {
				if l == next {
					return 0, nil
				}
				d := pos[l] - at[i] - 1
				if d < 0 {
					return 0, fmt.Errorf("seccomp: backward jump at %d", at[i])
				}
				return uint32(d), nil
			}
			if ins.Op == opJa {
				d, err := off(nd.jt)
				if err != nil {
					return nil, err
				}
				ins.K = d
			} else if ins.Op&0x07 == 0x05 {
				t, err := off(nd.jt)
				if err != nil {
					return nil, err
				}
				f, err := off(nd.jf)
				if err != nil {
					return nil, err
				}
				ins.Jt, ins.Jf = uint8(t), uint8(f)
			}
			prog = append(prog, ins)
		}
		return prog, nil
	}
}

// Bytes encodes p as the kernel's struct sock_filter array.
func (p Program) Bytes() []byte {
	b := make([]byte, 0, 8*len(p))
	for _, ins := range p {
		b = binary.LittleEndian.AppendUint16(b, ins.Op)
		b = append(b, ins.Jt, ins.Jf)
		b = binary.LittleEndian.AppendUint32(b, ins.K)
	}
	return b
}

// ProgramFromBytes decodes what Bytes encoded.
func ProgramFromBytes(b []byte) (Program, error) {
	if len(b)%8 != 0 || len(b) == 0 || len(b)/8 > maxInsns {
		return nil, fmt.Errorf("seccomp: program of %d bytes", len(b))
	}
	p := make(Program, len(b)/8)
	for i := range p {
		w := b[8*i:]
		p[i] = bpf.RawInstruction{Op: binary.LittleEndian.Uint16(w), Jt: w[2], Jf: w[3], K: binary.LittleEndian.Uint32(w[4:])}
	}
	return p, nil
}
