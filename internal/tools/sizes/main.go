// Command sizes enforces the repository's size limits on production Go
// code: no file over 800 lines and no function over 120 lines. Tests and
// generated files are exempt. A limit exceeded is reported with the
// file, the function and its length, and the command exits 1.
//
//	go run ./internal/tools/sizes [dir]
//
// Small units are easier to review and to test: a function that does not
// fit on two screens hides its invariants, and a file that big usually
// holds more than one concern.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

const (
	maxFileLines = 800
	maxFuncLines = 120
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	var problems []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (n == "testdata" || n == "vendor" || strings.HasPrefix(n, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if generated(src) {
			return nil
		}
		problems = append(problems, check(p, src)...)
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sizes:", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, p)
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "sizes: %d over the limits (files %d lines, functions %d lines)\n", len(problems), maxFileLines, maxFuncLines)
		os.Exit(1)
	}
}

// generated reports whether src carries the standard "Code generated ...
// DO NOT EDIT." line before its package clause.
func generated(src []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(src))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "package ") {
			return false
		}
		if strings.HasPrefix(l, "// Code generated ") && strings.HasSuffix(l, " DO NOT EDIT.") {
			return true
		}
	}
	return false
}

// check returns what in the file at p breaks a limit.
func check(p string, src []byte) []string {
	var out []string
	if n := bytes.Count(src, []byte("\n")); n > maxFileLines {
		out = append(out, fmt.Sprintf("%s: %d lines", p, n))
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, p, src, parser.SkipObjectResolution)
	if err != nil {
		return append(out, fmt.Sprintf("%s: %v", p, err))
	}
	ast.Inspect(f, func(n ast.Node) bool {
		var name string
		var body *ast.BlockStmt
		switch fn := n.(type) {
		case *ast.FuncDecl:
			name, body = fn.Name.Name, fn.Body
			if fn.Recv != nil && len(fn.Recv.List) > 0 {
				name = recvName(fn.Recv.List[0].Type) + "." + name
			}
		case *ast.FuncLit:
			name, body = "func literal", fn.Body
		}
		if body == nil {
			return true
		}
		start, end := fset.Position(n.Pos()).Line, fset.Position(body.End()).Line
		if l := end - start + 1; l > maxFuncLines {
			out = append(out, fmt.Sprintf("%s:%d: %s: %d lines", p, start, name, l))
		}
		return true
	})
	return out
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}
