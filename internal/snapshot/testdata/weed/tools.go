//go:build tools

// The SeaweedFS server that the snapshot package's S3 tests run on
// loopback, as a separate module so its many dependencies stay out of
// sandloop's go.mod.
package tools

import _ "github.com/seaweedfs/seaweedfs/weed"
