package main

import (
	"bufio"
	"bytes"
	"net"
	"strconv"
)

// cannedAnswer is a sites.get-sized 200 with the envelope's headers.
var cannedAnswer = func() []byte {
	body := `{"data":{"siteId":"site_0123456789abcdef","tenantId":"bench","kind":"custom","region":"eu-west","state":"active","createdAt":"2026-11-28T03:00:00Z","updatedAt":"2026-11-28T03:00:00Z","labels":{}}}`
	return []byte("HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Type: application/json\r\nDate: Sat, 28 Nov 2026 03:00:00 GMT\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// serveCanned answers every request on addr with cannedAnswer, doing as
// little as it can, so that a run against it measures the generator.
func serveCanned(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			br := bufio.NewReaderSize(c, maxLine)
			for {
				n := int64(0)
				for {
					line, err := readLine(br)
					if err != nil {
						return
					}
					if len(line) == 0 {
						break
					}
					if name, v, ok := bytes.Cut(line, []byte(":")); ok && asciiEqualFold(name, "content-length") {
						n, _ = strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
					}
				}
				if _, err := br.Discard(int(n)); err != nil {
					return
				}
				if _, err := c.Write(cannedAnswer); err != nil {
					return
				}
			}
		}()
	}
}
