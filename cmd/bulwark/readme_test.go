package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeSection returns the README's section under heading (up to the
// next heading of the same level).
func readmeSection(t *testing.T, heading string) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "\n"+heading+"\n")
	require.True(t, ok, "README has no %q", heading)
	level := heading[:strings.Index(heading, " ")+1]
	if i := strings.Index(rest, "\n"+level); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// TestREADMEDescribesAccountExport: the README names every file
// `account export` writes, preferences included, and claims none is
// left out.
func TestREADMEDescribesAccountExport(t *testing.T) {
	t.Parallel()
	sec := readmeSection(t, "## Importing and exporting repositories")
	for _, f := range []string{exportCARFile, exportBlobsDir + "/<cid>", exportPrefsFile, exportManifestFile} {
		require.Contains(t, sec, "`"+f+"`")
	}
	require.NotContains(t, sec, "preferences are not exported")
}
