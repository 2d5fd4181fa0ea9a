package cli

import (
	"fmt"
	"time"

	"github.com/csiactor/csiactor/runtime"
)

// usageRows adds what the plugin last reported of the volume's usage and
// condition to a volume status table: rows "Usage", "Inodes", "Condition"
// and "Checked", each only when the plugin reported it.
func usageRows(t *table, v runtime.Volume) {
	var checked time.Time
	if u := v.Usage; u != nil {
		if u.CapacityBytes > 0 || u.UsedBytes > 0 {
			t.row("Usage", fmt.Sprintf("%s of %s used%s, %s available",
				bytesOrZero(u.UsedBytes), formatSize(u.CapacityBytes), percent(u.UsedBytes, u.CapacityBytes), bytesOrZero(u.AvailableBytes)))
		}
		if u.Inodes > 0 || u.InodesUsed > 0 {
			t.row("Inodes", fmt.Sprintf("%d of %d used%s, %d free", u.InodesUsed, u.Inodes, percent(u.InodesUsed, u.Inodes), u.InodesFree))
		}
		checked = u.CheckedAt
	}
	if c := v.Condition; c != nil {
		s := "normal"
		if c.Abnormal {
			s = "abnormal: " + orDash(c.Message)
		}
		t.row("Condition", s)
		if c.CheckedAt.After(checked) {
			checked = c.CheckedAt
		}
	}
	if !checked.IsZero() {
		t.row("Checked", checked.UTC().Format(time.RFC3339))
	}
}

// bytesOrZero is formatSize, with "0 B" for nothing.
func bytesOrZero(n int64) string {
	if n <= 0 {
		return "0 B"
	}
	return formatSize(n)
}

// percent is " (42%)", the share of part in whole, or "" without a whole.
func percent(part, whole int64) string {
	if whole <= 0 {
		return ""
	}
	return fmt.Sprintf(" (%.0f%%)", float64(part)*100/float64(whole))
}
