package backup

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestContainerImageCarriesPGTools: the container image installs the
// Debian client package of the Postgres major its compose file runs, and
// points BULWARK_PG_BIN_DIR where that package puts pg_dump and
// pg_restore, the directory findTool then uses. Where this machine has
// Debian's package of that major, its file list and the programs
// themselves are checked too.
func TestContainerImageCarriesPGTools(t *testing.T) {
	t.Parallel()
	dockerfile, err := os.ReadFile("../Dockerfile")
	require.NoError(t, err)
	compose, err := os.ReadFile("../docker-compose.yml")
	require.NoError(t, err)
	df := string(dockerfile)

	m := regexp.MustCompile(`(?m)^ARG PG_MAJOR=(\d+)$`).FindStringSubmatch(df)
	require.NotNil(t, m, "the final stage declares PG_MAJOR")
	major, _ := strconv.Atoi(m[1])
	require.Regexp(t, `(?m)^\s+image: postgres:`+m[1]+`$`, string(compose), "compose runs the server the image's tools match")
	require.Regexp(t, `(?m)^\s+PG_MAJOR: "`+m[1]+`"$`, string(compose), "compose builds the image for its server")
	require.Contains(t, df, `"postgresql-client-${PG_MAJOR}"`)
	require.Contains(t, df, "BULWARK_PG_BIN_DIR=/usr/lib/postgresql/${PG_MAJOR}/bin")
	final := df[strings.LastIndex(df, "\nFROM "):]
	require.Contains(t, final, "ARG PG_MAJOR", "the ARG is in scope in the stage that uses it")

	binDir := "/usr/lib/postgresql/" + m[1] + "/bin"
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("no dpkg: the package's file list cannot be checked here")
	}
	out, err := exec.Command("dpkg", "-L", "postgresql-client-"+m[1]).Output()
	if err != nil {
		t.Skipf("postgresql-client-%s is not installed here", m[1])
	}
	for _, prog := range []string{"pg_dump", "pg_restore"} {
		require.Contains(t, strings.Split(string(out), "\n"), binDir+"/"+prog)
		tool, err := findTool(context.Background(), prog, binDir, major)
		require.NoError(t, err)
		require.Equal(t, binDir+"/"+prog, tool.path)
		require.Equal(t, major, tool.major)
	}
}
