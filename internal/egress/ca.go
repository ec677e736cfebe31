package egress

import (
	"crypto"
	"crypto/x509"
)

// CA is a sandbox's own certificate authority: with inspection on, the
// proxy terminates the sandbox's TLS with leaf certificates it signs,
// and the sandbox trusts it (its trust store and the usual environment
// variables name it).
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}
