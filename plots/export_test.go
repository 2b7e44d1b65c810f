package plots

// EncodeColumn is encodeColumn, for the tests.
var EncodeColumn = encodeColumn
