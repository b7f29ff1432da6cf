package httpmsg_test

import (
	"fmt"
	"net/http"

	"github.com/diskerhq/disker/internal/httpmsg"
)

func ExampleEncodeRequest() {
	content, err := httpmsg.EncodeRequest(&httpmsg.Request{
		Method: "POST",
		URL:    "/items?id=7",
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"name":"seven"}`),
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(string(content))

	req, err := httpmsg.DecodeRequest(content)
	if err != nil {
		panic(err)
	}
	fmt.Println(req.Method, req.URL, req.Header.Get("Content-Type"), string(req.Body))
	// Output:
	// {"disker_http":"request/1","method":"POST","url":"/items?id=7","header":{"Content-Type":["application/json"]}}
	// {"name":"seven"}
	// POST /items?id=7 application/json {"name":"seven"}
}

func ExampleDecodeResponse() {
	content, _ := httpmsg.EncodeResponse(&httpmsg.Response{Status: 404, Body: []byte("not here")})
	resp, err := httpmsg.DecodeResponse(content)
	if err != nil {
		panic(err)
	}
	fmt.Println(resp.Status, string(resp.Body))

	_, err = httpmsg.DecodeResponse([]byte("plain text"))
	fmt.Println(err)
	// Output:
	// 404 not here
	// httpmsg: content is not an encoded HTTP message (want response/1)
}
