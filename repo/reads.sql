-- Reads bounded by bytes as well as by count: what one request may make
-- the server hold in memory. octet_length of a stored (TOASTed) value reads
-- its header, not the value, so sizing rows costs no more than finding
-- them, and the data of rows past the bound is never read.

-- name: ListRecordsAsc
-- Up to $4 records after rkey $3, ending early where the records so far
-- would pass $5 bytes (the first always comes, so a page always moves
-- on). n is how many the count alone would give: more than returned means
-- the page was cut short.
WITH page AS (
    SELECT rkey, cid, data FROM records
    WHERE did = $1 AND collection = $2 AND rkey > $3
    ORDER BY rkey
    LIMIT $4
), sized AS (
    SELECT rkey, cid, data,
           sum(octet_length(data)) OVER (ORDER BY rkey ROWS UNBOUNDED PRECEDING) AS total,
           row_number() OVER (ORDER BY rkey) AS i,
           count(*) OVER () AS n
    FROM page
)
SELECT rkey, cid, data, n FROM sized
WHERE total <= $5 OR i = 1
ORDER BY rkey;

-- name: ListRecordsDesc
-- ListRecordsAsc from the highest rkey down, before rkey $3. The first page
-- (no cursor) is ListRecordsNewest: one statement for both would read
-- "$3 = '' OR rkey < $3", which a plan cached for every call cannot serve
-- from the index, and each page would read the whole collection.
WITH page AS (
    SELECT rkey, cid, data FROM records
    WHERE did = $1 AND collection = $2 AND rkey < $3
    ORDER BY rkey DESC
    LIMIT $4
), sized AS (
    SELECT rkey, cid, data,
           sum(octet_length(data)) OVER (ORDER BY rkey DESC ROWS UNBOUNDED PRECEDING) AS total,
           row_number() OVER (ORDER BY rkey DESC) AS i,
           count(*) OVER () AS n
    FROM page
)
SELECT rkey, cid, data, n FROM sized
WHERE total <= $5 OR i = 1
ORDER BY rkey DESC;

-- name: ListRecordsNewest
-- ListRecordsDesc's first page: the $3 highest rkeys, bounded by $4 bytes.
WITH page AS (
    SELECT rkey, cid, data FROM records
    WHERE did = $1 AND collection = $2
    ORDER BY rkey DESC
    LIMIT $3
), sized AS (
    SELECT rkey, cid, data,
           sum(octet_length(data)) OVER (ORDER BY rkey DESC ROWS UNBOUNDED PRECEDING) AS total,
           row_number() OVER (ORDER BY rkey DESC) AS i,
           count(*) OVER () AS n
    FROM page
)
SELECT rkey, cid, data, n FROM sized
WHERE total <= $4 OR i = 1
ORDER BY rkey DESC;

-- name: BlockSizes
-- The size of each of the CIDs $2 that did's current repository holds.
SELECT cid, octet_length(data) FROM repo_nodes WHERE did = $1 AND cid = ANY($2::bytea[])
UNION ALL
SELECT cid, octet_length(data) FROM records WHERE did = $1 AND cid = ANY($2::bytea[]);

-- name: RecordSize
SELECT octet_length(data) FROM records WHERE did = $1 AND collection = $2 AND rkey = $3;
