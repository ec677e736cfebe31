package egress

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// CA is a sandbox's own certificate authority: with inspection on, the
// proxy terminates the sandbox's TLS with leaf certificates it signs,
// and the sandbox trusts it (its trust store and the usual environment
// variables name it).
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte

	leafOnce sync.Once
	leafKey  *ecdsa.PrivateKey // one key for every leaf: a key per name costs a generation per new host
	leafErr  error
	mu       sync.Mutex
	// +checklocks:mu
	leaves map[string]*tls.Certificate
}

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 30 * 24 * time.Hour
	// maxLeaves bounds the leaf cache: the sandbox chooses the names.
	maxLeaves = 1024
)

// NewCA makes a CA (ECDSA P-256, valid ten years) whose subject carries
// name.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ca key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"molt"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		SubjectKeyId:          keyID(&key.PublicKey),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("ca certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("ca certificate: %w", err)
	}
	return &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// ParseCA loads a CA written by CertPEM and KeyPEM.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("ca certificate: no CERTIFICATE PEM block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("ca certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("ca certificate: not a CA")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("ca key: no PEM block")
	}
	var k any
	switch kb.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(kb.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(kb.Bytes)
	default:
		return nil, fmt.Errorf("ca key: unexpected PEM block %q", kb.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("ca key: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("ca key: not a signing key")
	}
	pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("ca key: does not match the certificate")
	}
	return &CA{cert: cert, key: signer, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cb.Bytes})}, nil
}

// CertPEM returns the CA certificate, PEM-encoded: what the sandbox
// trusts.
func (c *CA) CertPEM() []byte { return bytes.Clone(c.pem) }

// KeyPEM returns the CA's private key, PKCS#8 PEM-encoded.
func (c *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(c.key)
	if err != nil {
		return nil, fmt.Errorf("ca key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// Certificate returns the parsed CA certificate.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// Leaf returns a server certificate for name (a DNS name or an IP
// address) signed by c, from a cache while it is fresh.
func (c *CA) Leaf(name string) (*tls.Certificate, error) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if name == "" {
		return nil, errors.New("leaf: empty name")
	}
	now := time.Now()
	c.mu.Lock()
	if l, ok := c.leaves[name]; ok && now.Before(l.Leaf.NotAfter.Add(-24*time.Hour)) {
		c.mu.Unlock()
		return l, nil
	}
	c.mu.Unlock()

	c.leafOnce.Do(func() { c.leafKey, c.leafErr = ecdsa.GenerateKey(elliptic.P256(), rand.Reader) })
	if c.leafErr != nil {
		return nil, fmt.Errorf("leaf key: %w", c.leafErr)
	}
	tmpl := &x509.Certificate{
		SerialNumber:   serial(),
		Subject:        pkix.Name{CommonName: name},
		NotBefore:      now.Add(-time.Hour),
		NotAfter:       now.Add(leafValidity),
		KeyUsage:       x509.KeyUsageDigitalSignature,
		ExtKeyUsage:    []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		AuthorityKeyId: c.cert.SubjectKeyId,
	}
	if tmpl.NotAfter.After(c.cert.NotAfter) {
		tmpl.NotAfter = c.cert.NotAfter
	}
	if ip, err := netip.ParseAddr(name); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip.AsSlice())
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &c.leafKey.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("leaf %s: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("leaf %s: %w", name, err)
	}
	l := &tls.Certificate{Certificate: [][]byte{der, c.cert.Raw}, PrivateKey: c.leafKey, Leaf: leaf}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leaves == nil {
		c.leaves = make(map[string]*tls.Certificate)
	}
	if len(c.leaves) >= maxLeaves {
		for k := range c.leaves { // any one: map order is random
			delete(c.leaves, k)
			break
		}
	}
	c.leaves[name] = l
	return l, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n.Add(n, big.NewInt(1))
}

func keyID(pub *ecdsa.PublicKey) []byte {
	b, _ := pub.Bytes()
	sum := sha256.Sum256(b)
	return sum[:20]
}
