package e2b

import (
	"net/http"

	"github.com/sandboxd/sandboxd/internal/edge"
)

// template is the part of E2B's Template the SDKs read when listing.
type template struct {
	TemplateID string   `json:"templateID"`
	Aliases    []string `json:"aliases"`
	Public     bool     `json:"public"`
	CPUCount   int      `json:"cpuCount"`
	MemoryMB   int      `json:"memoryMB"`
	DiskSizeMB int      `json:"diskSizeMB"`
	EnvdVer    string   `json:"envdVersion"`
}

func (a *API) templates(w http.ResponseWriter, _ *http.Request, _ edge.Caller) error {
	out := []template{}
	for _, id := range append([]string{DefaultTemplate}, a.opts.Templates...) {
		out = append(out, template{TemplateID: id, Aliases: []string{id}, Public: true, CPUCount: a.opts.CPUs, MemoryMB: a.opts.MemoryMB, DiskSizeMB: a.opts.DiskMB, EnvdVer: EnvdVersion})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
