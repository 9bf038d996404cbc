package main

import (
	"flag"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/serverid"
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

// TestREADMEBlueskyAppSettings: every setting the Bluesky app section
// names is a setting of serve, and the section names the settings each
// service of the app depends on.
func TestREADMEBlueskyAppSettings(t *testing.T) {
	t.Parallel()
	sec := readmeSection(t, "## Use it from the Bluesky app")
	fs, _ := settingsFlags("serve", io.Discard)
	known := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		known["BULWARK_"+strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))] = true
	})
	names := regexp.MustCompile(`BULWARK_[A-Z0-9_]*[A-Z0-9]`).FindAllString(sec, -1)
	require.NotEmpty(t, names)
	for _, n := range names {
		require.True(t, known[n], "%s is not a setting", n)
	}
	for _, n := range []string{"BULWARK_HOSTNAME", "BULWARK_CRAWLERS", "BULWARK_APPVIEW_URL", "BULWARK_APPVIEW_DID",
		"BULWARK_REPORT_SERVICE_URL", "BULWARK_MOD_SERVICE_URL", "BULWARK_HANDLE_DOMAINS", "BULWARK_INVITE_REQUIRED", "BULWARK_SMTP_URL"} {
		require.Contains(t, names, n)
	}
	require.Contains(t, sec, serverid.AskPath)
}
