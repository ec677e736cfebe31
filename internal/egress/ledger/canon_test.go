package ledger

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"testing"
)

func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.ParseRequestURI(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func jsonHeader() http.Header {
	return http.Header{"Content-Type": {"application/json"}}
}

func TestCanonBody(t *testing.T) {
	ignore := Canon{IgnoreJSONFields: []string{"timestamp", "nonce"}}
	form := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	text := http.Header{"Content-Type": {"text/plain"}}
	vnd := http.Header{"Content-Type": {"application/vnd.api+json; charset=utf-8"}}
	for _, c := range []struct {
		name  string
		canon Canon
		h     http.Header
		a, b  string
		same  bool
	}{
		{"json key order", Canon{}, jsonHeader(), `{"a":1,"b":{"y":2,"x":[1,2]}}`, ` { "b" : {"x":[1,2],"y":2}, "a":1 }`, true},
		{"json values differ", Canon{}, jsonHeader(), `{"a":1}`, `{"a":2}`, false},
		{"json array order kept", Canon{}, jsonHeader(), `[1,2]`, `[2,1]`, false},
		{"json number literal kept", Canon{}, jsonHeader(), `{"a":1.0}`, `{"a":1}`, false},
		{"json string escapes", Canon{}, jsonHeader(), `{"a":"\u0041"}`, `{"a":"A"}`, true},
		{"json +json type", Canon{}, vnd, `{"a":1,"b":2}`, `{"b":2,"a":1}`, true},
		{"json ignored fields nested", ignore, jsonHeader(),
			`{"amount":5,"timestamp":1,"meta":{"nonce":"x","items":[{"nonce":"a","id":1}]}}`,
			`{"meta":{"items":[{"id":1,"nonce":"b"}],"nonce":"y"},"amount":5,"timestamp":2}`, true},
		{"json ignored fields only when asked", Canon{}, jsonHeader(), `{"a":1,"timestamp":1}`, `{"a":1,"timestamp":2}`, false},
		{"json ignored fields keep the rest", ignore, jsonHeader(), `{"amount":5,"timestamp":1}`, `{"amount":6,"timestamp":1}`, false},
		{"invalid json is raw bytes", Canon{}, jsonHeader(), `{"a":1,"b":2`, `{"b":2,"a":1`, false},
		{"json with trailing data is raw", Canon{}, jsonHeader(), `{"a":1,"b":2} x`, `{"b":2,"a":1} x`, false},
		{"other types are raw", Canon{}, text, `{"a":1,"b":2}`, `{"b":2,"a":1}`, false},
		{"form order", Canon{}, form, "a=1&b=2&a=0", "b=2&a=0&a=1", true},
		{"form escapes", Canon{}, form, "a=x+y&b=%41", "b=A&a=x%20y", true},
		{"form values differ", Canon{}, form, "a=1", "a=2", false},
		{"form ignored fields", ignore, form, "a=1&nonce=5", "nonce=6&a=1", true},
		{"bad form is raw", Canon{}, form, "a=%zz&b=1", "b=1&a=%zz", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := mustURL(t, "/pay")
			a := c.canon.HTTP("http", "POST", "example.com", u, c.h, []byte(c.a))
			b := c.canon.HTTP("http", "POST", "example.com", u, c.h, []byte(c.b))
			if (a.BodyHash == b.BodyHash) != c.same {
				t.Fatalf("body hashes %s and %s: want same=%v", a.BodyHash, b.BodyHash, c.same)
			}
			if Equivalent(a, b) != c.same {
				t.Fatalf("Equivalent = %v, want %v", !c.same, c.same)
			}
		})
	}
}

func TestCanonRawAndEmptyBody(t *testing.T) {
	body := []byte(`{"b":1,"a":2`) // not JSON: hashed as sent
	id := Canon{}.HTTP("http", "POST", "h", mustURL(t, "/"), jsonHeader(), body)
	sum := sha256.Sum256(body)
	if id.BodyHash != hex.EncodeToString(sum[:]) {
		t.Fatalf("BodyHash %s, want the raw bytes' SHA-256", id.BodyHash)
	}
	if id := (Canon{}).HTTP("http", "GET", "h", mustURL(t, "/"), nil, nil); id.BodyHash != "" || id.HeaderHash != "" {
		t.Fatalf("empty request: %+v, want no body or header hash", id)
	}
}

func TestCanonURL(t *testing.T) {
	for _, c := range []struct {
		scheme, host, uri, want string
	}{
		{"HTTP", "Example.COM:80", "/a/b?x=1", "http://example.com/a/b?x=1"},
		{"https", "example.com:443", "/", "https://example.com/"},
		{"http", "example.com:443", "/", "http://example.com:443/"},
		{"https", "example.com:8443", "/p", "https://example.com:8443/p"},
		{"http", "[::1]:80", "/", "http://[::1]/"},
		{"http", "[::1]:8080", "/", "http://[::1]:8080/"},
		{"http", "h", "/q?b=2&a=3&a=1", "http://h/q?a=1&a=3&b=2"},
		{"http", "h", "/q?b&a=x%20y", "http://h/q?a=x+y&b="},
		{"http", "h", "/q?", "http://h/q"},
		{"http", "h", "/a%2Fb", "http://h/a%2Fb"},
		{"http", "h", "*", "http://h*"},
	} {
		var u *url.URL
		if c.uri == "*" {
			u = &url.URL{Opaque: "*"}
		} else {
			u = mustURL(t, c.uri)
		}
		id := Canon{}.HTTP(c.scheme, "GET", c.host, u, nil, nil)
		if id.URL != c.want {
			t.Errorf("%s %s %s: URL %q, want %q", c.scheme, c.host, c.uri, id.URL, c.want)
		}
	}
	// A fragment never reaches the URL.
	u := &url.URL{Path: "/p", Fragment: "frag"}
	if id := (Canon{}).HTTP("http", "GET", "h", u, nil, nil); id.URL != "http://h/p" {
		t.Errorf("URL %q kept the fragment", id.URL)
	}
	a := Canon{}.HTTP("http", "GET", "h", mustURL(t, "/a/b"), nil, nil)
	b := Canon{}.HTTP("http", "GET", "h", mustURL(t, "/a%2Fb"), nil, nil)
	if Equivalent(a, b) {
		t.Error("/a/b and /a%2Fb are equivalent; the path is compared as sent")
	}
	if id := (Canon{}).HTTP("https", "GET", "Example.com:443", mustURL(t, "/"), nil, nil); id.Host != "example.com" || id.Proto != "https" {
		t.Errorf("identity %+v: want host example.com, proto https", id)
	}
}

func TestCanonHeaders(t *testing.T) {
	base := http.Header{"Authorization": {"Bearer t"}, "Content-Type": {"application/json"}}
	hash := func(c Canon, h http.Header) string {
		return c.HTTP("https", "POST", "h", mustURL(t, "/"), h, nil).HeaderHash
	}
	want := hash(Canon{}, base)
	if want == "" {
		t.Fatal("no header hash")
	}
	// Header name case does not matter (a raw map, not canonicalized).
	if got := hash(Canon{}, http.Header{"authorization": {"Bearer t"}, "CONTENT-TYPE": {"application/json"}}); got != want {
		t.Error("header name case changed the hash")
	}
	noisy := base.Clone()
	for k, v := range map[string]string{
		"Date": "Tue, 01 Dec 2026 00:00:00 GMT", "User-Agent": "curl/8", "Accept-Encoding": "gzip",
		"Connection": "keep-alive", "Content-Length": "12", "Traceparent": "00-abc", "X-Request-Id": "r1",
		"X-B3-Traceid": "t", "X-B3-Spanid": "s", "Sentry-Trace": "x", "Baggage": "b", "Idempotency-Key": "k1",
		"X-Amzn-Trace-Id": "Root=1",
	} {
		noisy.Set(k, v)
	}
	if got := hash(Canon{}, noisy); got != want {
		t.Error("an ignored header changed the hash")
	}
	changed := base.Clone()
	changed.Set("Authorization", "Bearer u")
	if hash(Canon{}, changed) == want {
		t.Error("a changed Authorization did not change the hash")
	}
	extra := base.Clone()
	extra.Set("X-Signature", "abc")
	if hash(Canon{}, extra) == want {
		t.Error("an added header did not change the hash")
	}
	if hash(Canon{IgnoreHeaders: []string{"x-signature"}}, extra) != hash(Canon{IgnoreHeaders: []string{"x-signature"}}, base) {
		t.Error("Canon.IgnoreHeaders was not applied")
	}
	if hash(Canon{IgnoreHeaders: []string{"X-Sig*"}}, extra) != want {
		t.Error("a prefix pattern in Canon.IgnoreHeaders was not applied")
	}
	// Value order within one header is kept.
	a := http.Header{"Accept": {"a", "b"}}
	b := http.Header{"Accept": {"b", "a"}}
	if hash(Canon{}, a) == hash(Canon{}, b) {
		t.Error("value order of one header did not change the hash")
	}
}

func TestEquivalent(t *testing.T) {
	c := Canon{}
	h := func(key string) http.Header {
		h := jsonHeader()
		if key != "" {
			h.Set("X-Idempotency-Key", key)
		}
		return h
	}
	pay := c.HTTP("https", "POST", "pay.example", mustURL(t, "/v1/charge?a=1"), h("k1"), []byte(`{"amount":5}`))
	for _, x := range []struct {
		name string
		id   Identity
		want bool
	}{
		{"same", c.HTTP("https", "POST", "pay.example:443", mustURL(t, "/v1/charge?a=1"), h("k1"), []byte(`{ "amount": 5 }`)), true},
		{"same key, other body and query", c.HTTP("https", "POST", "pay.example", mustURL(t, "/v1/charge?a=2"), h("k1"), []byte(`{"amount":6}`)), true},
		{"other key, other body", c.HTTP("https", "POST", "pay.example", mustURL(t, "/v1/charge?a=1"), h("k2"), []byte(`{"amount":6}`)), false},
		{"no key, same request", c.HTTP("https", "POST", "pay.example", mustURL(t, "/v1/charge?a=1"), h(""), []byte(`{"amount":5}`)), true},
		{"no key, other body", c.HTTP("https", "POST", "pay.example", mustURL(t, "/v1/charge?a=1"), h(""), []byte(`{"amount":6}`)), false},
		{"same key, other path", c.HTTP("https", "POST", "pay.example", mustURL(t, "/v1/refund?a=1"), h("k1"), []byte(`{"amount":5}`)), false},
		{"same key, other host", c.HTTP("https", "POST", "other.example", mustURL(t, "/v1/charge?a=1"), h("k1"), []byte(`{"amount":5}`)), false},
		{"same key, other method", c.HTTP("https", "PUT", "pay.example", mustURL(t, "/v1/charge?a=1"), h("k1"), []byte(`{"amount":5}`)), false},
		{"http is not https", c.HTTP("http", "POST", "pay.example", mustURL(t, "/v1/charge?a=1"), h("k1"), []byte(`{"amount":5}`)), false},
	} {
		if got := Equivalent(pay, x.id); got != x.want {
			t.Errorf("%s: Equivalent = %v, want %v", x.name, got, x.want)
		}
		if got := Equivalent(x.id, pay); got != x.want {
			t.Errorf("%s (swapped): Equivalent = %v, want %v", x.name, got, x.want)
		}
	}
	if pay.IdempotencyKey != "k1" {
		t.Errorf("IdempotencyKey %q, want k1", pay.IdempotencyKey)
	}
	first := http.Header{"Idempotency-Key": {"first"}, "X-Idempotency-Key": {"second"}}
	if id := c.HTTP("http", "POST", "h", mustURL(t, "/"), first, nil); id.IdempotencyKey != "first" {
		t.Errorf("IdempotencyKey %q, want the first header's", id.IdempotencyKey)
	}
	// Connections: where they went is their identity.
	a := Identity{Proto: "tls", Host: "a.example", Addr: "192.0.2.1:443"}
	if Equivalent(a, Identity{Proto: "tls", Host: "b.example", Addr: "192.0.2.1:443"}) ||
		Equivalent(a, Identity{Proto: "tls", Host: "a.example", Addr: "192.0.2.2:443"}) ||
		!Equivalent(a, Identity{Proto: "TLS", Host: "a.example", Addr: "192.0.2.1:443"}) {
		t.Error("connection identities compared wrongly")
	}
}
