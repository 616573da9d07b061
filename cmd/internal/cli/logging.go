// Package cli holds what Machinist's commands share: the manager command,
// which two binaries serve, and the flags of logging, clients and
// providers.
package cli

import (
	"fmt"

	"github.com/spf13/pflag"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// LogFlags are the structured-logging flags every long-running command has.
type LogFlags struct {
	format string
	level  string
}

// Add adds the flags to fs.
func (f *LogFlags) Add(fs *pflag.FlagSet) {
	fs.StringVar(&f.format, "log-format", "text", "log encoding: json (one object per line, for collectors) or text (for people)")
	fs.StringVar(&f.level, "log-level", "info", "least severe level logged: debug, info or error")
}

// SetUp installs the logger for controller-runtime and for client-go's
// klog, so that every library logs the same way.
func (f *LogFlags) SetUp() error {
	var level zapcore.Level
	if err := level.UnmarshalText([]byte(f.level)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info or error", f.level)
	}
	opts := zap.Options{Level: level}
	switch f.format {
	case "json":
	case "text":
		opts.Development = true
	default:
		return fmt.Errorf("--log-format %q: want json or text", f.format)
	}
	logger := zap.New(zap.UseFlagOptions(&opts))
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)
	return nil
}
