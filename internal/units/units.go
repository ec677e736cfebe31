// Package units renders quantities for people.
package units

import "fmt"

// Bytes renders n bytes in binary units with one decimal: "512 B",
// "1.5 KiB", "12.3 MiB", "2.0 GiB".
func Bytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
