#include <doctest/doctest.h>

#include <cstdlib>

#include "launcher/errors.h"
#include "launcher/spelling.h"
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

TEST_CASE("numbers: fixed notation in range, and the error names the unit and the range") {
    CHECK(parse_number("0", 0, 3600, "--shutdown-grace", "seconds") == 0.0);
    CHECK(parse_number("2.5", 0, 3600, "--shutdown-grace", "seconds") == doctest::Approx(2.5));
    CHECK(parse_number("3600", 0, 3600, "--shutdown-grace", "seconds") == 3600.0);
    CHECK(parse_seconds("1.25", 10, "DP_X") == doctest::Approx(1.25));
    CHECK_THROWS_WITH_AS(parse_seconds("11", 10, "DP_X"),
                         doctest::Contains("DP_X '11': expected a number of seconds from 0 to 10"),
                         UsageError);
    for (const char* bad : {"-1", "nan", "inf", "3601", "1s", "", "1e9", "+1", "0x10"}) {
        CAPTURE(bad);
        CHECK_THROWS_WITH_AS(parse_number(bad, 0, 3600, "--shutdown-grace", "seconds"),
                             doctest::Contains("expected a number of seconds from 0 to 3600"), UsageError);
    }
    CHECK_THROWS_WITH_AS(parse_number("0.5", 1, 2.5, "--x"),
                         doctest::Contains("--x '0.5': expected a number from 1 to 2.5"), UsageError);
    CHECK(number_text(7) == "7");
    CHECK(number_text(1.5) == "1.5");
    CHECK(number_text(67108864) == "67108864");
}

TEST_CASE("unsigned 64-bit numbers and choices") {
    CHECK(parse_u64("0", "--seed") == 0);
    CHECK(parse_u64("18446744073709551615", "--seed") == UINT64_MAX);
    for (const char* bad : {"", "-1", "+1", "18446744073709551616", "1.0", "x", " 1"}) {
        CAPTURE(bad);
        CHECK_THROWS_WITH_AS(parse_u64(bad, "--seed"),
                             doctest::Contains("expected a whole number from 0 to 18446744073709551615"),
                             UsageError);
    }
    const std::vector<std::string> dtypes = {"fp32", "bf16", "fp16"};
    CHECK(parse_choice("bf16", dtypes, "--dtype") == "bf16");
    for (const char* bad : {"", "FP32", "fp64", "fp32 "}) {
        CAPTURE(bad);
        const std::string wanted = "DP_DTYPE '" + std::string(bad) + "': expected one of fp32, bf16, fp16";
        CHECK_THROWS_WITH_AS(parse_choice(bad, dtypes, "DP_DTYPE"), doctest::Contains(wanted.c_str()),
                             UsageError);
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
    CHECK(gpu_ids_text({3, 1, 2}) == "3,1,2");
    CHECK(gpu_ids_text({}).empty());
    for (const char* bad : {"", ",", "0,", ",1", "a", "-1", "1,1", "0 ,1", "99999"}) {
        CAPTURE(bad);
        CHECK_THROWS_AS(parse_gpu_ids(bad, "--gpu-ids"), UsageError);
    }
}

TEST_CASE("hosts") {
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
}

TEST_CASE("did you mean: the closest known name, a swap, a case or a separator, or the name begun") {
    const std::vector<std::string> known = {"num-processes", "num_processes",  "nnodes", "max-restarts",
                                            "text-encoder",  "text-encoder-2", "tee",    "steps"};
    struct Case {
        const char* given;
        std::vector<std::string> meant;
    };
    const std::vector<Case> cases = {
        {"num-proceses", {"num-processes"}},  // a letter left out
        {"num_proceses", {"num_processes"}},  // the spelling that separates as given
        {"Num-Processes", {"num-processes"}},
        {"nnodse", {"nnodes"}},  // two letters swapped
        {"max-restart", {"max-restarts"}},
        {"max-rest", {"max-restarts"}},  // begun, as argparse's abbreviations
        {"text", {"text-encoder", "text-encoder-2"}},
        {"stesp", {"steps"}},
        {"tea", {"tee"}},
        {"zzzzzz", {}},  // nothing close
        {"te", {"tee"}},
        {"num-processes", {}},  // known: nothing to suggest
        {"s", {}},
        {"", {}},
    };
    for (const Case& c : cases) {
        CAPTURE(c.given);
        CHECK(closest_names(c.given, known) == c.meant);
    }
    CHECK(spelling_distance("ab", "ba") == 1);
    CHECK(spelling_distance("num_processes", "NUM-PROCESSES") == 0);
    CHECK(spelling_distance("", "abc") == 3);
    CHECK(did_you_mean("stesp", known) == " (did you mean 'steps'?)");
    CHECK(did_you_mean("zzzzzz", known).empty());
    CHECK(closest_names(std::string(5000, 'x'), known).empty());  // bounded work on any input
    try {
        parse_choice("dynamc", {"auto", "static", "dynamic"}, "--schedule");
        FAIL("accepted");
    } catch (const UsageError& e) {
        CHECK(std::string(e.what()) ==
              "--schedule 'dynamc': expected one of auto, static, dynamic (did you mean 'dynamic'?)");
    }
}
