package scopes

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// A group whose baseline moved nothing has no ratio: null in JSON, where
// x / 0 = +Inf made json.Marshal fail ("unsupported value: +Inf").
func TestRatioOfAnEmptyBaseline(t *testing.T) {
	require.True(t, math.IsNaN(float64(ratioOf(5e6, 0))))
	require.True(t, math.IsNaN(float64(ratioOf(0, 0))))
	require.Equal(t, Ratio(0.5), ratioOf(1, 2))
	b, err := json.Marshal(struct{ A, B Ratio }{ratioOf(5e6, 0), ratioOf(1, 4)})
	require.NoError(t, err)
	require.JSONEq(t, `{"A": null, "B": 0.25}`, string(b))
}
