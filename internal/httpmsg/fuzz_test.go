package httpmsg

import (
	"bytes"
	"reflect"
	"testing"
)

// FuzzDecode feeds arbitrary content to both decoders. Neither may panic,
// and whatever decodes must encode again and decode to the same value.
// Interesting inputs live in testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		"{\"disker_http\":\"request/1\",\"method\":\"GET\",\"url\":\"/x?y=1\",\"header\":{\"A\":[\"b\"]}}\nbody",
		"{\"disker_http\":\"response/1\",\"status\":200,\"header\":{\"Content-Type\":[\"text/plain\"]}}\n\x00\xff\n",
		"{\"disker_http\":\"request/1\",\"method\":\"POST\",\"url\":\"/\",\"header\":{\"connection\":[\"x-a\"],\"x-a\":[\"1\"]}}\n",
		"not http",
		"{}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		if req, err := DecodeRequest(content); err == nil {
			again, err := EncodeRequest(req)
			if err != nil {
				t.Fatalf("decoded request does not encode: %v", err)
			}
			req2, err := DecodeRequest(again)
			if err != nil {
				t.Fatalf("re-encoded request does not decode: %v", err)
			}
			if req2.Method != req.Method || req2.URL != req.URL || req2.Host != req.Host ||
				req2.RemoteAddr != req.RemoteAddr || !bytes.Equal(req2.Body, req.Body) ||
				!reflect.DeepEqual(req2.Header, req.Header) {
				t.Fatalf("round trip changed the request: %+v -> %+v", req, req2)
			}
		}
		if resp, err := DecodeResponse(content); err == nil {
			again, err := EncodeResponse(resp)
			if err != nil {
				t.Fatalf("decoded response does not encode: %v", err)
			}
			resp2, err := DecodeResponse(again)
			if err != nil {
				t.Fatalf("re-encoded response does not decode: %v", err)
			}
			if resp2.Status != resp.Status || !bytes.Equal(resp2.Body, resp.Body) || !reflect.DeepEqual(resp2.Header, resp.Header) {
				t.Fatalf("round trip changed the response: %+v -> %+v", resp, resp2)
			}
		}
	})
}
