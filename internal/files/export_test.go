package files

// For the external test package (api_test.go), which drives this service
// through the API server: the API imports this package, so those tests
// cannot live inside it.
var (
	PNGBytes = pngBytes
	Git      = git
)
