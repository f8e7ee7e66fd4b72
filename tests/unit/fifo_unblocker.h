#pragma once
// A FIFO's reader that would wait for a writer, unblocked: for the tests that a FIFO is refused
// rather than waited on, so that a regression fails instead of hanging the test.

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace dp::test {

// Opens the FIFO at `path` for writing and closes it again, every 50 ms from `after_s` seconds on,
// until destroyed: a reader that opened it to wait for data gets end-of-file, and fails instead of
// hanging the test.
class FifoUnblocker {
  public:
    FifoUnblocker(std::string path, double after_s)
        : thread_([this, path = std::move(path), after_s] {
              const auto start = std::chrono::steady_clock::now();
              while (!done_) {
                  std::this_thread::sleep_for(std::chrono::milliseconds(50));
                  if (std::chrono::steady_clock::now() - start < std::chrono::duration<double>(after_s))
                      continue;
                  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);  // ENXIO while nobody reads
                  if (fd >= 0) ::close(fd);
              }
          }) {}
    ~FifoUnblocker() {
        done_ = true;
        thread_.join();
    }
    FifoUnblocker(const FifoUnblocker&) = delete;
    FifoUnblocker& operator=(const FifoUnblocker&) = delete;

  private:
    std::atomic<bool> done_{false};
    std::thread thread_;
};

}  // namespace dp::test
