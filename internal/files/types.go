package files

// TreeEntry is one entry of a repository's recursive tree, as the API
// sends it.
type TreeEntry struct {
	Path string `json:"path"`
	Type string `json:"type" jsonschema:"enum=blob,enum=tree"`
	SHA  string `json:"sha"`
	Size *int64 `json:"size,omitempty" jsonschema:"description=Size in bytes (blobs only)"`
}

// Committed is one file an upload committed, as the API sends it.
type Committed struct {
	Path string `json:"path"`
	SHA  string `json:"sha"`
}

// Upload is files to download and commit in one commit of main: into Dir
// ("" the repository's root) with Message (default "Upload files").
type Upload struct {
	Files   []Source
	Dir     string
	Message string
}

// Source is one file of an Upload: where to download it and its name.
type Source struct {
	URL  string
	Name string
}
