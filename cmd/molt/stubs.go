package main

import "github.com/spf13/cobra"

func benchCmd(g *globals) *cobra.Command { return &cobra.Command{Use: "bench", Short: "Benchmarks"} }
func demoCmd(g *globals) *cobra.Command  { return &cobra.Command{Use: "demo", Short: "Demo"} }
