#pragma once
// What this machine offers, read from the kernel and the NVIDIA driver's /proc files: no CUDA
// runtime, no LibTorch, so the launcher stays fast to start.

#include <string>
#include <vector>

namespace dp::launcher {

// CPUs this process may run on (sched_getaffinity), at least 1.
int usable_cpu_count();

// GPUs a child would see: the entries of CUDA_VISIBLE_DEVICES when set, else the devices the
// driver lists under /proc/driver/nvidia/gpus. 0 when there is no NVIDIA driver.
int visible_gpu_count();
// Why a CUDA_VISIBLE_DEVICES value is not one CUDA reads as its user means it, or empty. Accepted:
// empty (no GPU), a comma list of device indexes, GPU-... and MIG-... UUIDs, and CUDA's own stops
// -1 and NoDevFiles (the entries after them are hidden). Anything else CUDA would read as a stop
// too, silently hiding the devices the user named.
std::string cuda_visible_devices_problem(const std::string& value);

struct GpuInfo {
    std::string bus_id;
    std::string model;
};

// The driver's device list (empty without a driver), sorted by PCI bus id.
std::vector<GpuInfo> driver_gpus();

// "NVRM version: ..." from /proc/driver/nvidia/version, or empty.
std::string nvidia_driver_version();

// This machine's host name (gethostname), "?" when it has none.
std::string host_name();

// "Linux 6.1.0 x86_64" and the distribution's PRETTY_NAME when /etc/os-release has one.
std::string os_description();

}  // namespace dp::launcher
