package webhooks

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// How a delivery is made.
const (
	// maxAnswerRead bounds what is read of a receiver's answer (its status
	// is what counts; a little of its body says why it refused).
	maxAnswerRead = 4 << 10
	// maxErrorKept bounds the error a delivery keeps.
	maxErrorKept = 512
	// maxBackoff bounds the wait between two attempts.
	maxBackoff = time.Hour
)

// The headers of a sandboxd delivery. The signature is an HMAC-SHA256,
// keyed with the webhook's secret, of the timestamp, ".", and the body, in
// hex, as "v1=<hex>": a receiver recomputes it and refuses a timestamp too
// old (a replay).
const (
	HeaderWebhookID  = "Sandboxd-Webhook-Id"
	HeaderDeliveryID = "Sandboxd-Delivery-Id"
	HeaderEvent      = "Sandboxd-Event"
	HeaderTimestamp  = "Sandboxd-Timestamp"
	HeaderSignature  = "Sandboxd-Signature"
)

// Sign is the Sandboxd-Signature of body sent at unix time ts.
func Sign(secret []byte, ts int64, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(strconv.FormatInt(ts, 10)))
	m.Write([]byte("."))
	m.Write(body)
	return "v1=" + hex.EncodeToString(m.Sum(nil))
}

// SignE2B is E2B's e2b-signature of body: the SHA-256 of the secret then
// the body, in unpadded URL-safe base64 (E2B's documented check).
func SignE2B(secret, body []byte) string {
	h := sha256.New()
	h.Write(secret)
	h.Write(body)
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// RegisterWorkers adds the delivery worker.
func (s *Service) RegisterWorkers(w *river.Workers) {
	river.AddWorker(w, &worker{s: s})
}

// worker makes one attempt of a delivery.
type worker struct {
	river.WorkerDefaults[jobs.DeliverWebhookArgs]
	s *Service
}

// NextRetry waits RetryBase before the second attempt, twice as long
// before each later one, at most an hour.
func (w *worker) NextRetry(job *river.Job[jobs.DeliverWebhookArgs]) time.Time {
	wait := w.s.cfg.RetryBase << min(max(job.Attempt-1, 0), 20)
	return time.Now().Add(min(wait, maxBackoff))
}

// Timeout bounds an attempt: the request's own timeout, and a margin.
func (w *worker) Timeout(*river.Job[jobs.DeliverWebhookArgs]) time.Duration {
	return w.s.cfg.Timeout + 10*time.Second
}

func (w *worker) Work(ctx context.Context, job *river.Job[jobs.DeliverWebhookArgs]) error {
	return w.s.attempt(ctx, job.Args.DeliveryID, job.Attempt, job.Attempt >= job.MaxAttempts)
}

// attempt makes attempt n of delivery id and records it; last says no
// attempt follows a failure. An error asks River for another attempt.
func (s *Service) attempt(ctx context.Context, id string, n int, last bool) error {
	d, err := s.st.GetDelivery(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil // its event was swept
	}
	if err != nil {
		return err
	}
	if d.Status != store.DeliveryQueued {
		return nil // cancelled, or made by an earlier run of this job
	}
	wh, err := s.st.GetWebhook(ctx, d.WebhookID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !wh.Enabled) {
		_, err = s.st.RecordDeliveryAttempt(ctx, id, store.DeliveryCancelled, d.Attempts, 0, "the webhook was deleted or disabled")
		return err
	}
	if err != nil {
		return err
	}
	ev, err := s.st.GetEvent(ctx, d.EventID)
	if err != nil {
		return err
	}
	code, sendErr := s.send(ctx, wh, d, ev)
	status, errText := store.DeliveryDelivered, ""
	if sendErr != nil {
		status, errText = store.DeliveryQueued, clip(sendErr.Error(), maxErrorKept)
		if last {
			status = store.DeliveryFailed
		}
	}
	if _, err := s.st.RecordDeliveryAttempt(context.WithoutCancel(ctx), id, status, n, code, errText); err != nil {
		return err
	}
	if sendErr != nil {
		s.log.Info("webhook delivery failed", "delivery_id", id, "webhook_id", wh.ID, "attempt", n, "last", last, "status", code, "err", errText)
		if last {
			return nil // spent: recorded as failed
		}
		return fmt.Errorf("delivery %s, attempt %d: %w", id, n, sendErr)
	}
	s.log.Info("webhook delivered", "delivery_id", id, "webhook_id", wh.ID, "attempt", n, "status", code)
	return nil
}

// send POSTs event ev to webhook wh as delivery d and answers the
// receiver's status; a status outside 2xx, or none, is an error.
func (s *Service) send(ctx context.Context, wh store.Webhook, d store.Delivery, ev store.Event) (int, error) {
	secret, err := s.box.Open(wh.ID, wh.Secret)
	if err != nil {
		return 0, fmt.Errorf("the webhook's secret does not open with this server's key")
	}
	defer clear(secret)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, wh.URL, nil)
	if err != nil {
		return 0, err
	}
	var body []byte
	if wh.Format == store.WebhookFormatE2B {
		body, err = json.Marshal(s.e2bEvent(ctx, ev))
		if err != nil {
			return 0, err
		}
		req.Header.Set("e2b-webhook-id", wh.ID)
		req.Header.Set("e2b-delivery-id", d.ID)
		req.Header.Set("e2b-signature-version", "v1")
		req.Header.Set("e2b-signature", SignE2B(secret, body))
	} else {
		body, err = json.Marshal(ev)
		if err != nil {
			return 0, err
		}
		ts := s.cfg.Now().Unix()
		req.Header.Set(HeaderWebhookID, wh.ID)
		req.Header.Set(HeaderDeliveryID, d.ID)
		req.Header.Set(HeaderEvent, ev.Type)
		req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
		req.Header.Set(HeaderSignature, Sign(secret, ts, body))
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "sandboxd-webhooks/1")
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, errors.New(reason(err))
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswerRead))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		msg := fmt.Sprintf("the receiver answered %d", resp.StatusCode)
		if a := strings.TrimSpace(string(answer)); a != "" {
			msg += ": " + clip(a, 200)
		}
		return resp.StatusCode, errors.New(msg)
	}
	return resp.StatusCode, nil
}

// reason says why a request failed without repeating its URL (whose
// query may carry the receiver's token).
func reason(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if r := fetch.Reason(err); r != "download failed" {
		return r
	}
	return "request failed: " + err.Error()
}

// clip cuts s to at most n bytes, at a rune.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
