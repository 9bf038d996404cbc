package plctest

import (
	"net/http"
	"net/http/httptest"
)

// Client returns an HTTP client whose requests d answers in this process,
// whatever host they name. A server running a development directory gives
// it to its own PLC client: an operation is then verified and stored
// without a connection, and cannot reach any other directory.
func (d *Directory) Client() *http.Client {
	return &http.Client{Transport: inProcess{h: d}}
}

// inProcess is a RoundTripper that calls a handler directly.
type inProcess struct {
	h http.Handler
}

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	// A RoundTripper must not change the caller's request.
	r := req.Clone(req.Context())
	if r.Body == nil {
		r.Body = http.NoBody
	}
	r.RequestURI = r.URL.RequestURI()
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}
