package ledger

// TEMPORARY (branch proxy): stand-ins for Match and Canon so the proxy
// builds before the ledger's own versions land. Delete this file at
// merge; the ledger's definitions replace it.

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
)

// Match is what the ledger knows of a request's identity on a
// sandbox's line.
type Match struct {
	Orphan  *Record // an orphaned committed effect with this identity
	Pending *Record // a pending record with this identity
	Orphans int     // orphans on the line at all
}

// Canon are the equivalence rules for requests.
type Canon struct {
	IgnoreHeaders    []string
	IgnoreJSONFields []string
}

// HTTP returns the identity of an HTTP request.
func (c Canon) HTTP(scheme, method, host string, u *url.URL, header http.Header, body []byte) Identity {
	scheme = strings.ToLower(scheme)
	host = strings.ToLower(host)
	if h, p, err := net.SplitHostPort(host); err == nil && (scheme == "http" && p == "80" || scheme == "https" && p == "443") {
		host = h
	}
	path := u.EscapedPath()
	if path == "" {
		path = "/"
	}
	cu := scheme + "://" + host + path
	if q := u.Query().Encode(); q != "" {
		cu += "?" + q
	}
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	ignored := map[string]bool{}
	for _, h := range c.IgnoreHeaders {
		ignored[strings.ToLower(h)] = true
	}
	var keys []string
	for k := range header {
		if !ignored[strings.ToLower(k)] {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return strings.ToLower(keys[i]) < strings.ToLower(keys[j]) })
	hh := sha256.New()
	for _, k := range keys {
		hh.Write([]byte(strings.ToLower(k) + ": " + strings.Join(header[k], ",") + "\n"))
	}
	bh := sha256.Sum256(body)
	return Identity{
		Proto:          scheme,
		Method:         method,
		URL:            cu,
		Host:           name,
		BodyHash:       hex.EncodeToString(bh[:]),
		HeaderHash:     hex.EncodeToString(hh.Sum(nil)),
		IdempotencyKey: header.Get("Idempotency-Key"),
	}
}
