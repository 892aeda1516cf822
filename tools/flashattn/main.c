/* flashattn — the command-line tool: bench, check, io, report. */
#include "common.h"

#include <string.h>

static void main_help(void) {
    printf("usage: flashattn <command> [options]\n"
           "\n"
           "Exact attention on the CPU and CUDA: standard, FlashAttention-1, FlashAttention-2, FLASH3 (Hopper GPUs,\n"
           "forward), and KV-cache decoding (fa_forward_kvcache: contiguous or paged caches, split-KV).\n"
           "\n"
           "commands:\n"
           "  bench    time the algorithms (--mode attention, the docs/benchmarks.md protocol) or KV-cache decoding\n"
           "           (--mode kvcache); comma lists expand to a product\n"
           "  check    every algorithm, forward and backward, against the float64 oracle on random shapes\n"
           "  io       counted slow-memory bytes per algorithm next to the paper's formulas\n"
           "  report   measure the FlashAttention claims and KV-cache decoding's on this machine; writes\n"
           "           report/index.md with plots\n"
           "\n"
           "  flashattn <command> --help    options of a command\n"
           "  flashattn --version           version and what this build contains\n"
           "\n"
           "Exit status: 0 success, 1 a measurement or check failed, 2 bad arguments.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        main_help();
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        main_help();
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("flashattn %s\ncuda backend available: %s\n", fa_version_string(),
               fa_backend_available(FA_BACKEND_CUDA) ? "yes" : "no");
        return 0;
    }
    if (strcmp(cmd, "bench") == 0) return cmd_bench(argc - 2, argv + 2);
    if (strcmp(cmd, "check") == 0) return cmd_check(argc - 2, argv + 2);
    if (strcmp(cmd, "io") == 0) return cmd_io(argc - 2, argv + 2);
    if (strcmp(cmd, "report") == 0) return cmd_report(argc - 2, argv + 2);
    return cli_usage_error(NULL, "unknown command '%s' (expected bench, check, io or report)", cmd);
}
