package main

import (
	_ "embed"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed queries.sql
var queriesSQL string

var (
	queries            = db.MustParseQueries(queriesSQL)
	qVacuumAnalyze     = queries.MustGet("VacuumAnalyze")
	qPopulatedHistory  = queries.MustGet("PopulatedHistory")
	qTableSizes        = queries.MustGet("TableSizes")
	qCurveSettings     = queries.MustGet("CurveSettings")
	qCurveTotals       = queries.MustGet("CurveTotals")
	qCurveDIDs         = queries.MustGet("CurveDIDs")
	qCurveLastSeq      = queries.MustGet("CurveLastSeq")
	qCurveEventTime    = queries.MustGet("CurveEventTime")
	qCurveEventsBefore = queries.MustGet("CurveEventsBefore")
	qCurveBlockStats   = queries.MustGet("CurveBlockStats")
	qCurveActivity     = queries.MustGet("CurveActivity")
)
