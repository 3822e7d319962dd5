package operr_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/operr"
)

func TestWrapOnePrefix(t *testing.T) {
	bound := fmt.Errorf("placement: memory windows are bound to the MR: %w", unix.EBUSY)
	inner := operr.Wrap("placement", "dereg MR", bound)
	assert.Equal(t, "placement: dereg MR: memory windows are bound to the MR: device or resource busy", inner.Error())
	outer := operr.Wrap("softrdma", "dereg MR", inner)
	assert.Equal(t, "softrdma: dereg MR: memory windows are bound to the MR: device or resource busy", outer.Error())
	assert.ErrorIs(t, outer, bound)
	assert.ErrorIs(t, outer, unix.EBUSY)
	var oe *operr.Error
	assert.ErrorAs(t, outer, &oe)

	// Other text is kept: only leading package and operation prefixes go.
	assert.Equal(t, "softrdma: remap: MR 3: placement: x", operr.Wrap("softrdma", "remap", errors.New("MR 3: placement: x")).Error())
	assert.Equal(t, "softrdma: reg MR: invalid argument", operr.Wrap("softrdma", "reg MR", unix.EINVAL).Error())
	assert.Equal(t, "placement: reg MR: hostmem: pin 1 bytes", operr.Wrap("placement", "reg MR", errors.New("hostmem: pin 1 bytes")).Error(),
		"the prefix of the facility that refused stays")
	assert.NoError(t, operr.Wrap("softrdma", "reg MR", nil))
}
