package waiter

// memfd_create(2) on amd64: the syscall package has no name for it.
const sysMemfdCreate = 319
