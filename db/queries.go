package db

import (
	"fmt"
	"strings"
)

// Queries is a set of named SQL statements loaded from an embedded .sql file.
//
// A file holds statements separated by marker lines of the form
//
//	-- name: InsertBlock
//
// Each package keeps its SQL in such a file and resolves every name once at
// init with MustGet, so a typo fails at start-up, not on a request path.
type Queries map[string]string

// ParseQueries splits src into named statements.
func ParseQueries(src string) (Queries, error) {
	q := Queries{}
	var name string
	var body strings.Builder
	flush := func() error {
		if name == "" {
			if strings.TrimSpace(body.String()) != "" {
				return fmt.Errorf("sql before the first '-- name:' marker")
			}
			return nil
		}
		stmt := strings.TrimSpace(body.String())
		if stmt == "" {
			return fmt.Errorf("query %q is empty", name)
		}
		if _, dup := q[name]; dup {
			return fmt.Errorf("query %q defined twice", name)
		}
		q[name] = strings.TrimSuffix(stmt, ";")
		return nil
	}
	for _, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(trimmed, "-- name:"); ok {
			if err := flush(); err != nil {
				return nil, err
			}
			name = strings.TrimSpace(rest)
			body.Reset()
			continue
		}
		if strings.HasPrefix(trimmed, "--") {
			continue
		}
		body.WriteString(line)
		body.WriteByte('\n')
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return q, nil
}

// MustParseQueries is ParseQueries for embedded files, which are known at
// build time: a malformed file is a programming error.
func MustParseQueries(src string) Queries {
	q, err := ParseQueries(src)
	if err != nil {
		panic("db: " + err.Error())
	}
	return q
}

// MustGet returns the named statement or panics.
func (q Queries) MustGet(name string) string {
	s, ok := q[name]
	if !ok {
		panic(fmt.Sprintf("db: no query named %q", name))
	}
	return s
}
