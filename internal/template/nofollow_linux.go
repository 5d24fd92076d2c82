package template

import "syscall"

const syscallNoFollow = syscall.O_NOFOLLOW
