package egress

import (
	"crypto/x509"
	"testing"
	"time"
)

func TestCA(t *testing.T) {
	ca, err := NewCA("molt sandbox sb1")
	if err != nil {
		t.Fatal(err)
	}
	c := ca.Certificate()
	if !c.IsCA || c.Subject.CommonName != "molt sandbox sb1" || c.NotAfter.Before(time.Now().Add(9*365*24*time.Hour)) {
		t.Errorf("ca %v %v %v", c.IsCA, c.Subject, c.NotAfter)
	}
	key, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := ParseCA(ca.CertPEM(), key)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	for _, name := range []string{"api.example.com", "10.1.2.3"} {
		l, err := ca2.Leaf(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
			t.Errorf("leaf %s: %v", name, err)
		}
		if again, _ := ca2.Leaf(name); again != l {
			t.Errorf("leaf %s not cached", name)
		}
	}
	other, _ := NewCA("other")
	otherKey, _ := other.KeyPEM()
	if _, err := ParseCA(ca.CertPEM(), otherKey); err == nil {
		t.Error("ParseCA accepted a key of another CA")
	}
	if _, err := ParseCA([]byte("junk"), key); err == nil {
		t.Error("ParseCA accepted junk")
	}
}
