package netlab

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"
)

// certs are the lab's CA and the one leaf certificate every HTTPS
// server presents (all of the lab's names and addresses).
type certs struct {
	pool *x509.CertPool
	leaf tls.Certificate
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// writeCA makes the lab's CA and leaf and writes the CA's certificate
// to dir (a new temporary directory when "").
func (l *Lab) writeCA(dir string) error {
	if dir == "" {
		d, err := os.MkdirTemp("", "molt-lab-")
		if err != nil {
			return err
		}
		dir = d
		l.closers = append(l.closers, func() error { return os.RemoveAll(d) })
	}
	c, caPEM, err := newCerts(l.hosts)
	if err != nil {
		return fmt.Errorf("lab certificates: %w", err)
	}
	l.certs, l.CAPEM = c, caPEM
	l.CAFile = filepath.Join(dir, l.Name+"-ca.pem")
	return os.WriteFile(l.CAFile, caPEM, 0o644)
}

func newCerts(hosts map[string]netip.Addr) (*certs, []byte, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "molt test lab CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: WebName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"*." + Zone},
	}
	seen := map[netip.Addr]bool{}
	for n, a := range hosts {
		tmpl.DNSNames = append(tmpl.DNSNames, n)
		if !seen[a] {
			seen[a] = true
			tmpl.IPAddresses = append(tmpl.IPAddresses, net.IP(a.AsSlice()))
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	c := &certs{pool: pool, leaf: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}}
	return c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}

// serverTLS is the HTTPS servers' configuration.
func (c *certs) serverTLS() *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{c.leaf},
		NextProtos:   []string{"h2", "http/1.1"},
		MinVersion:   tls.VersionTLS12,
	}
}
