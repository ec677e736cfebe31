package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	v1 "github.com/molt-sh/molt/api/v1"
)

func tenantCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "tenant", Short: "Manage tenants (the host admin, over the socket): they own sandboxes, reached by their tokens"}
	c.AddCommand(&cobra.Command{
		Use: "create NAME", Short: "Make a tenant", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			t, err := g.client().CreateTenant(ctx, args[0])
			if err != nil {
				return err
			}
			return g.print(t, func() { fmt.Println(t.Name) })
		},
	}, &cobra.Command{
		Use: "ls", Short: "List tenants", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			l, err := g.client().Tenants(ctx)
			if err != nil {
				return err
			}
			return g.print(l, func() {
				for _, t := range l {
					fmt.Printf("%s\t%s\n", t.Name, t.Created.Format("2006-01-02 15:04:05"))
				}
			})
		},
	}, &cobra.Command{
		Use: "rm NAME", Short: "Delete a tenant that owns no sandbox, with its tokens", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			return g.client().DeleteTenant(ctx, args[0])
		},
	})
	return c
}

func tokenCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "token", Short: "Manage tenants' API tokens (the host admin, over the socket)"}
	var req v1.TokenCreateRequest
	var scopes string
	create := &cobra.Command{
		Use: "create --tenant NAME [--scope read,exec,checkpoint,rollback,admin] [--sandbox ID...]", Short: "Make a token; prints it once (only its hash is kept)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			if scopes != "" {
				req.Scopes = strings.Split(scopes, ",")
			}
			t, err := g.client().CreateToken(ctx, req)
			if err != nil {
				return err
			}
			return g.print(t, func() { fmt.Println(t.Secret) })
		},
	}
	create.Flags().StringVar(&req.Tenant, "tenant", "", "the tenant the token acts for")
	create.Flags().StringVar(&scopes, "scope", "", "comma-separated scopes: read, exec, checkpoint, rollback, admin (default all but admin)")
	create.Flags().StringArrayVar(&req.Sandboxes, "sandbox", nil, "a sandbox ID the token reaches (repeatable; default all of the tenant's)")
	create.Flags().StringVar(&req.Note, "note", "", "what the token is for")
	var tenant string
	ls := &cobra.Command{
		Use: "ls [--tenant NAME]", Short: "List tokens (never their secrets)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			l, err := g.client().Tokens(ctx, tenant)
			if err != nil {
				return err
			}
			return g.print(l, func() {
				for _, t := range l {
					fmt.Printf("%s\t%s\t%s\t%s\n", t.ID, t.Tenant, strings.Join(t.Scopes, ","), t.Note)
				}
			})
		},
	}
	ls.Flags().StringVar(&tenant, "tenant", "", "only this tenant's")
	c.AddCommand(create, ls, &cobra.Command{
		Use: "rm ID", Short: "Revoke a token", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			return g.client().DeleteToken(ctx, args[0])
		},
	})
	return c
}

func keyCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "key", Short: "Manage the tenants' data keys of encryption at rest (the host admin; molt daemon --kek-file)"}
	var tenant string
	var yes bool
	rotate := &cobra.Command{
		Use: "rotate [--tenant NAME]", Short: "Give a tenant (default: the host's own sandboxes) a new data key; what older keys sealed stays readable", Args: cobra.NoArgs,
		Example: "  molt key rotate --tenant acme",
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			k, err := g.client().RotateDataKey(ctx, tenant)
			if err != nil {
				return err
			}
			return g.print(k, func() { fmt.Println(k.ID) })
		},
	}
	rotate.Flags().StringVar(&tenant, "tenant", "", "tenant whose key to rotate (default: the host's own sandboxes)")
	shred := &cobra.Command{
		Use: "shred --tenant NAME --yes", Short: "Delete every data key of a tenant: its encrypted checkpoints, turn logs and ledgers become unreadable, for good", Args: cobra.NoArgs,
		Example: "  molt key shred --tenant acme --yes",
		RunE: func(cmd *cobra.Command, args []string) error {
			if !yes {
				return fmt.Errorf("shredding cannot be undone: add --yes")
			}
			ctx, cancel := ctx()
			defer cancel()
			r, err := g.client().ShredDataKeys(ctx, tenant)
			if err != nil {
				return err
			}
			return g.print(r, func() { fmt.Printf("%d keys of tenant %q shredded\n", r.Shredded, r.Tenant) })
		},
	}
	shred.Flags().StringVar(&tenant, "tenant", "", "tenant whose keys to shred (\"\" the host's own sandboxes)")
	shred.Flags().BoolVar(&yes, "yes", false, "confirm: the data the keys sealed can never be read again")
	c.AddCommand(&cobra.Command{
		Use: "ls", Short: "List data keys (IDs, never the keys)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			l, err := g.client().DataKeys(ctx)
			if err != nil {
				return err
			}
			return g.print(l, func() {
				for _, k := range l {
					t, cur := k.Tenant, ""
					if t == "" {
						t = "(host)"
					}
					if k.Current {
						cur = "current"
					}
					fmt.Printf("%s\t%s\t%s\t%s\t%s\n", t, k.ID, k.KEK, k.Created.Format("2006-01-02 15:04:05"), cur)
				}
			})
		},
	}, rotate, shred)
	return c
}
