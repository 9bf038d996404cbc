package main

import (
	_ "embed"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed queries.sql
var queriesSQL string

var (
	queries           = db.MustParseQueries(queriesSQL)
	qVacuumAnalyze    = queries.MustGet("VacuumAnalyze")
	qPopulatedHistory = queries.MustGet("PopulatedHistory")
	qTableSizes       = queries.MustGet("TableSizes")
)
