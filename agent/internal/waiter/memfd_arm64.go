package waiter

// memfd_create(2) on arm64: the syscall package has no name for it.
const sysMemfdCreate = 279
