#pragma once
// Every rank of a job runs the same job: the check made through the job's store before any rank
// loads the model. Light header.

#include <string>

#include "protocol/job_file.h"

namespace dp::runtime {

class Communicator;

// Note [one job on every node]
// Each node's dp-launch reads its own prompt file and flags and writes its own job file. A node
// started with another prompt file, other flags or another --output-dir would still split the
// requests by rank, and its ranks would write other images under the names the other nodes
// expect, or leave prompts to nobody. So once the group is formed, every rank posts its job file's
// settings (every field but the requests and the launcher's job_id) and the SHA-256 and count of
// its requests to the job's store; rank 0 compares each rank's with its own and posts one verdict;
// every rank reads it. When they differ every rank stops with the same usage error (exit 2), so
// every node refuses and says which node differs, in which setting, before any model is loaded.
// 2 × world store operations in all: rank 0 reads each rank's once, the others read two keys.

// Returns rank 0's job_id (the job's: its launcher's). Throws protocol::UsageError naming the
// first rank whose job differs from rank 0's (its node and host, the settings that differ, or the
// prompts' count and digest), CommunicationError when the store fails. Every rank calls it once,
// in the same place.
// `round` counts the jobs a group ran before this one (Note [warm ranks]): each job's postings
// have keys of their own in the group's store.
std::string agree_on_job(const protocol::JobFile& job, Communicator& comm, int round = 0);

}  // namespace dp::runtime
