package modelproxy

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestProxyCountsWhatAnswersUse: the tokens an answer reports count
// against the account's day however the answer comes (the provider is a
// fake, see fakeProvider): an Anthropic stream (message_start and
// message_delta), an OpenAI stream whose client did not ask for its usage
// (the proxy asks), a JSON answer the caller asked to be gzipped, a JSON
// answer of megabytes with its usage at the end, and a stream the caller
// cut after its first event.
func TestProxyCountsWhatAnswersUse(t *testing.T) {
	securitytest.Attack(t, "quotas",
		"code in a sandbox has its model answers streamed, gzipped, made megabytes long, or cuts the stream before its end, so that the tokens they use go uncounted and the daily token budget never fills",
		"every answer's reported tokens are counted in the account's day: Anthropic and OpenAI streams (the proxy asks OpenAI for the usage chunk), answers whose encoding the caller chose, usage after megabytes of JSON, and a stream's tokens reported before the caller went away")
	f := newFixtureWith(t, func(o *Options) { o.Budgets = Budgets{TokensPerDay: 1 << 40} })
	anthropic := map[string]string{"x-api-key": f.sbKey}
	openai := map[string]string{"Authorization": "Bearer " + f.sbKey}
	cases := []struct {
		name       string
		rep        report
		path, body string
		headers    map[string]string
		wantIn     int64
		wantOut    int64
		cut        bool // read the first event, then go away
	}{
		{"anthropic stream", report{input: 100, cacheRead: 1000, output: 50}, "/model/anthropic/v1/messages?beta=true", `{"model":"m","stream":true}`, anthropic, 1100, 50, false},
		{"openai stream", report{input: 200, output: 30}, "/model/openai/chat/completions", `{"model":"m","stream":true}`, openai, 200, 30, false},
		{"gzip asked", report{input: 7, output: 3}, "/model/anthropic/v1/messages", `{"model":"m"}`,
			map[string]string{"x-api-key": f.sbKey, "Accept-Encoding": "gzip"}, 7, 3, false},
		{"megabytes of JSON", report{input: 777}, "/model/openai/embeddings", `{"model":"m","input":"x"}`, openai, 777, 0, false},
		{"stream cut by the caller", report{input: 5000, cacheRead: 20000}, "/model/anthropic/v1/messages", `{"model":"m","stream":true,"hang":true}`, anthropic, 25000, 1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.setReport(tc.rep)
			before, err := f.st.GetModelUsage(t.Context(), f.account, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequest("POST", f.proxy.URL+tc.path, strings.NewReader(tc.body))
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			if tc.cut {
				cutStream(t, req)
			} else {
				resp, body := send(t, req)
				if resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "" || !strings.Contains(body, "usage") {
					t.Fatalf("%d %v %.200s", resp.StatusCode, resp.Header, body)
				}
			}
			<-f.got
			after := waitUsage(t, f.st, f.account, before.Requests+1)
			if in, out := after.InputTokens-before.InputTokens, after.OutputTokens-before.OutputTokens; in != tc.wantIn || out != tc.wantOut {
				t.Fatalf("counted %d input and %d output tokens, want %d and %d", in, out, tc.wantIn, tc.wantOut)
			}
		})
	}
}

// cutStream reads a stream's first event and goes away.
func cutStream(t *testing.T, req *http.Request) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "event: message_start\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
}

// waitUsage waits for the account's day to count n requests: a stream its
// caller cut is counted when the proxy notices, after the caller left.
func waitUsage(t *testing.T, st *store.Store, account string, n int64) store.ModelUsage {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		u, err := st.GetModelUsage(t.Context(), account, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if u.Requests >= n {
			return u
		}
		if time.Now().After(deadline) {
			t.Fatalf("the account's day counts %d requests, want %d", u.Requests, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestJSONUsage: only the top-level "usage" of a JSON answer counts, read
// as the answer passes in pieces of any size.
func TestJSONUsage(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		in, out    int64
	}{
		{"anthropic", `{"id":"m","usage":{"input_tokens":3,"cache_creation_input_tokens":4,"cache_read_input_tokens":5,"output_tokens":6}}`, 12, 6},
		{"openai", `{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":8}}}`, 10, 2},
		{"usage first, spaces", "{ \"usage\" :\n {\"input_tokens\": 1.0e3, \"output_tokens\": 2} , \"x\": [1, {\"usage\": {\"input_tokens\": 9}}]}", 1000, 2},
		{"nested usage does not count", `{"content":[{"type":"tool_use","input":{"usage":{"input_tokens":999}}}],"usage":{"input_tokens":1,"output_tokens":1}}`, 1, 1},
		{"usage in a string", `{"text":"\"usage\": {\"input_tokens\": 999}","x":"usage","usage":{"output_tokens":4}}`, 0, 4},
		{"a value named usage", `{"kind":"usage","n":{"input_tokens":999}}`, 0, 0},
		{"key usagex", `{"usagex":{"input_tokens":999}}`, 0, 0},
		{"escaped quote before", `{"a":"\\","usage":{"input_tokens":5}}`, 5, 0},
		{"usage null", `{"usage":null}`, 0, 0},
		{"negative and huge", `{"usage":{"input_tokens":-5,"output_tokens":1e300}}`, 0, maxTokens},
		{"not JSON", `usage: 5`, 0, 0},
		{"cut short", `{"usage":{"input_tokens":5`, 0, 0},
	} {
		for _, piece := range []int{1, 7, len(tc.body)} {
			s := &jsonUsage{}
			for b := []byte(tc.body); len(b) > 0; b = b[min(piece, len(b)):] {
				s.write(b[:min(piece, len(b))])
			}
			if u := s.usage(); u.input() != tc.in || u.output() != tc.out {
				t.Errorf("%s in pieces of %d: %d in, %d out; want %d, %d", tc.name, piece, u.input(), u.output(), tc.in, tc.out)
			}
		}
	}
}

// TestStreamUsage: a stream's usage events, whatever the pieces they come
// in, and a last line without its newline.
func TestStreamUsage(t *testing.T) {
	stream := "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":90,\"output_tokens\":1}}}\r\n\r\n" +
		"data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"usage\"}}\n\n" +
		"data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n" +
		"data: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":10,\"output_tokens\":42}}"
	for _, piece := range []int{1, 5, len(stream)} {
		s := &sseUsage{}
		for b := []byte(stream); len(b) > 0; b = b[min(piece, len(b)):] {
			s.write(b[:min(piece, len(b))])
		}
		if u := s.usage(); u.input() != 100 || u.output() != 42 {
			t.Errorf("pieces of %d: %d in, %d out", piece, u.input(), u.output())
		}
	}
	// A line longer than the bound is skipped, the next one read.
	s := &sseUsage{}
	s.write([]byte("data: " + strings.Repeat("x", maxEventLine) + "\n"))
	s.write([]byte("data: {\"usage\":{\"prompt_tokens\":3}}\n"))
	if u := s.usage(); u.input() != 3 {
		t.Errorf("after a long line: %+v", u)
	}
}
