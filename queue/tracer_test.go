package queue

import "testing"

func TestOpName(t *testing.T) {
	for sql, want := range map[string]string{
		"-- herald:preflight\nWITH k AS (SELECT 1)": "preflight",
		"  -- herald:push_lock\nSELECT":             "push_lock",
		"begin":                                     "begin",
		"SELECT 1":                                  "select",
		"-- a comment\nUPDATE t SET x = 1":          "update",
		"with x as (select 1) select * from x":      "with",
		"VACUUM":                                    "other",
		"":                                          "other",
	} {
		if got := opName(sql); got != want {
			t.Errorf("opName(%q) = %q, want %q", sql, got, want)
		}
	}
}
