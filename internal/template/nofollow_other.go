//go:build !linux

package template

const syscallNoFollow = 0
