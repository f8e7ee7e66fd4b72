#pragma once
// Note [closed standard descriptors]: a program started with fd 0, 1 or 2 closed (`2>&-`, a
// daemon's careless fork) would hand that number to the next file it opens, and a later write to
// "stderr" would land in it (a scratch record, the manifest, a lock file). dp-launch and dp-worker
// call this first thing in main: every one of fds 0-2 that is closed is opened on /dev/null
// (reading for 0, writing for 1 and 2), so that nothing they open later takes their place.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace dp::protocol {

inline void open_missing_standard_fds() {
    for (int fd = 0; fd <= 2; ++fd) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        // The lowest free number is `fd` itself: the ones below it are open by now.
        const int opened = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (opened != -1 && opened != fd) {
            dup2(opened, fd);
            close(opened);
        }
    }
}

}  // namespace dp::protocol
