#include <doctest/doctest.h>

#include <cstdlib>

#include "launcher/errors.h"
#include "launcher/values.h"

using namespace dp::launcher;

TEST_CASE("whole numbers in range are accepted, everything else names the source") {
    CHECK(parse_int("3", 1, 8, "--nnodes") == 3);
    CHECK(parse_int("0", 0, 8, "--node-rank") == 0);
    for (const char* bad :
         {"", "0", "9", "-1", "+3", "3x", " 3", "3 ", "1e3", "0x10", "99999999999999999999", "3.0"}) {
        CAPTURE(bad);
        try {
            parse_int(bad, 1, 8, "--nnodes");
            FAIL("accepted");
        } catch (const UsageError& e) {
            CHECK(std::string(e.what()).find("--nnodes") == 0);
            CHECK(std::string(e.what()).find("from 1 to 8") != std::string::npos);
            CHECK(e.exit_code() == 2);
        }
    }
}

TEST_CASE("process counts: a number or auto, never zero, negative or huge") {
    CHECK(parse_process_count("4", {}, "-n") == 4);
    CHECK(parse_process_count("auto", {0, 3, 5}, "-n") == 3);
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    CHECK(parse_process_count("auto", {}, "-n") == 1);  // no GPUs visible: one process
    setenv("CUDA_VISIBLE_DEVICES", "1,2", 1);
    CHECK(parse_process_count("auto", {}, "-n") == 2);
    unsetenv("CUDA_VISIBLE_DEVICES");
    for (const char* bad : {"0", "-2", "1025", "100000000000", "two", "", "Auto"}) {
        CAPTURE(bad);
        CHECK_THROWS_WITH_AS(parse_process_count(bad, {}, "--num-processes"),
                             doctest::Contains("expected 'auto' or a whole number from 1 to 1024"),
                             UsageError);
    }
}

TEST_CASE("seconds") {
    CHECK(parse_seconds("0", 3600, "--shutdown-grace") == 0.0);
    CHECK(parse_seconds("2.5", 3600, "--shutdown-grace") == doctest::Approx(2.5));
    for (const char* bad : {"-1", "nan", "inf", "3601", "1s", "", "1e9"}) {
        CAPTURE(bad);
        CHECK_THROWS_AS(parse_seconds(bad, 3600, "--shutdown-grace"), UsageError);
    }
}

TEST_CASE("booleans") {
    for (const char* yes : {"1", "true", "TRUE", "yes", "on"}) CHECK(parse_bool(yes, "DP_QUIET"));
    for (const char* no : {"0", "false", "No", "off"}) CHECK_FALSE(parse_bool(no, "DP_QUIET"));
    CHECK_THROWS_WITH_AS(parse_bool("maybe", "DP_QUIET"), doctest::Contains("DP_QUIET 'maybe'"), UsageError);
}

TEST_CASE("gpu ids") {
    CHECK(parse_gpu_ids("0", "--gpu-ids") == std::vector<int>{0});
    CHECK(parse_gpu_ids("3,1,2", "--gpu-ids") == std::vector<int>{3, 1, 2});
    for (const char* bad : {"", ",", "0,", ",1", "a", "-1", "1,1", "0 ,1", "99999"}) {
        CAPTURE(bad);
        CHECK_THROWS_AS(parse_gpu_ids(bad, "--gpu-ids"), UsageError);
    }
}

TEST_CASE("hosts and ports") {
    CHECK(parse_host("127.0.0.1", "--master-addr") == "127.0.0.1");
    CHECK(parse_host("::1", "--master-addr") == "::1");
    CHECK(parse_host("[fe80::1]", "--master-addr") == "fe80::1");
    CHECK(parse_host("node-0.cluster.local", "--master-addr") == "node-0.cluster.local");
    for (const char* bad : {"", "300.1.1.1", "1.2.3", "bad host", "-node", "node-", "a..b", "host:29500",
                            "[::1", "x/y", "\x01"}) {
        CAPTURE(bad);
        CHECK_THROWS_WITH_AS(parse_host(bad, "--master-addr"), doctest::Contains("--master-addr"),
                             UsageError);
    }
    CHECK(parse_port("29500", "--master-port") == 29500);
    for (const char* bad : {"0", "65536", "-1", "http", ""}) {
        CAPTURE(bad);
        CHECK_THROWS_AS(parse_port(bad, "--master-port"), UsageError);
    }
}
