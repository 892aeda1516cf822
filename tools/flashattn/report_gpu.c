/* flashattn report, GPU extras: DRAM bytes measured by Nsight Compute (ncu) for one forward of each algorithm,
 * next to the bytes the CUDA backend models; and PyTorch's scaled_dot_product_attention as a reference line.
 * Both run as child processes (ncu profiles `flashattn bench`; python runs a small script written beside the
 * report), and both say plainly when the tool is not installed. */
#define _POSIX_C_SOURCE 200809L /* popen, pclose, readlink */
#include "report.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Split one CSV line with quoted fields; returns the number of fields (commas inside quotes are dropped, as ncu
 * prints "1,234" style numbers). */
static int csv_fields(char *line, char **f, int max) {
    int n = 0;
    char *p = line;
    while (*p && n < max) {
        if (*p == '"') {
            p++;
            char *w = p;
            f[n++] = w;
            while (*p && *p != '"') {
                if (*p != ',') *w++ = *p;
                p++;
            }
            if (*p == '"') p++;
            *w = 0;
            /* w may trail p; the terminator was written at or before the closing quote */
            if (*p == ',') p++;
        } else {
            f[n++] = p;
            while (*p && *p != ',' && *p != '\n' && *p != '\r') p++;
            if (*p) *p++ = 0;
        }
    }
    return n;
}

static void self_exe(char *buf, size_t len) {
    ssize_t k = readlink("/proc/self/exe", buf, len - 1);
    if (k <= 0) snprintf(buf, len, "flashattn");
    else buf[k] = 0;
}

void report_ncu(report *R) {
    static const struct { int64_t b, h, n, d; } cfg[2] = {{4, 16, 4096, 64}, {1, 16, 16384, 128}};
    static const char *algos[3] = {"standard", "flash1", "flash2"};
    if (system("command -v ncu >/dev/null 2>&1") != 0) {
        snprintf(R->ncu_status, sizeof R->ncu_status,
                 "`ncu` (Nsight Compute) is not installed on this machine, so no DRAM counters were read; the GPU's "
                 "slow-memory bytes in this report are the backend's model only");
        return;
    }
    char exe[1024];
    self_exe(exe, sizeof exe);
    FILE *csv = report_csv(R, "ncu_cuda.csv", 2);
    for (int c = 0; c < 2; c++)
        for (int a = 0; a < 3 && R->n_ncu < 8; a++) {
            ncu_row *r = &R->ncu[R->n_ncu++];
            memset(r, 0, sizeof *r);
            snprintf(r->algo, sizeof r->algo, "%s", algos[a]);
            r->b = cfg[c].b, r->h = cfg[c].h, r->n = cfg[c].n, r->d = cfg[c].d;
            r->compulsory = 4.0 * (double)(r->b * r->h * r->n * r->d) * 2; /* Q, K, V, O in bf16 */
            char args[512];
            snprintf(args, sizeof args,
                     "bench --device cuda --dtype bf16 --algo %s --d %lld --batch %lld --heads %lld --seqlen %lld "
                     "--reps 1 --warmup 0",
                     algos[a], (long long)r->d, (long long)r->b, (long long)r->h, (long long)r->n);
            if (R->repro) fprintf(R->repro, "ncu_cuda.csv\t%s\n", args);
            /* the model: the same call in this process */
            {
                char buf[512], *argv[32];
                snprintf(buf, sizeof buf, "%s --csv", args + 6);
                int argc = 0;
                for (char *t = strtok(buf, " "); t && argc < 32; t = strtok(NULL, " ")) argv[argc++] = t;
                rows_t rows = {0};
                report_bench_rows(argc, argv, &rows);
                if (rows.n && rows.v[0].ok) {
                    r->model_read = (double)rows.v[0].read_bytes;
                    r->model_write = (double)rows.v[0].write_bytes;
                    snprintf(r->kernel, sizeof r->kernel, "%s", rows.v[0].kernel);
                } else if (rows.n) {
                    snprintf(r->note, sizeof r->note, "%s: %.150s", rows.v[0].status, rows.v[0].note);
                }
                free(rows.v), free(rows.others);
            }
            if (r->note[0]) continue;
            char cmd[2048];
            snprintf(cmd, sizeof cmd,
                     "ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv --print-units base "
                     "--clock-control none '%s' %s 2>&1",
                     exe, args);
            FILE *p = popen(cmd, "r");
            if (!p) {
                snprintf(r->note, sizeof r->note, "cannot run ncu");
                continue;
            }
            char line[4096];
            int i_name = -1, i_val = -1, kernels = 0;
            double rd = 0, wr = 0;
            while (fgets(line, sizeof line, p)) {
                if (line[0] != '"') continue;
                char *f[64];
                int nf = csv_fields(line, f, 64);
                if (i_name < 0) {
                    for (int k = 0; k < nf; k++) {
                        if (strcmp(f[k], "Metric Name") == 0) i_name = k;
                        if (strcmp(f[k], "Metric Value") == 0) i_val = k;
                    }
                    continue;
                }
                if (i_val >= nf || i_name >= nf) continue;
                double v = atof(f[i_val]);
                if (strcmp(f[i_name], "dram__bytes_read.sum") == 0) rd += v, kernels++;
                else if (strcmp(f[i_name], "dram__bytes_write.sum") == 0) wr += v;
            }
            int rc = pclose(p);
            if (i_name < 0 || kernels == 0) {
                snprintf(r->note, sizeof r->note, "ncu gave no DRAM metrics (exit %d; profiling may need root)", rc);
                continue;
            }
            /* bench ran the forward twice (warm-up + 1 rep), every kernel profiled */
            r->ok = 1;
            r->dram_read = rd / 2;
            r->dram_write = wr / 2;
            r->kernels = kernels / 2;
            if (csv)
                fprintf(csv, "%s,%lld,%lld,%lld,%lld,%d,%.0f,%.0f,%.0f,%.0f,%.0f\n", r->algo, (long long)r->b,
                        (long long)r->h, (long long)r->n, (long long)r->d, r->kernels, r->dram_read, r->dram_write,
                        r->model_read, r->model_write, r->compulsory);
        }
    if (csv) fclose(csv);
    snprintf(R->ncu_status, sizeof R->ncu_status, "measured with `ncu` (dram__bytes_read.sum / dram__bytes_write.sum, "
                                                  "--clock-control none), one forward, bf16");
}

static const char *TORCH_SCRIPT =
    "# PyTorch scaled_dot_product_attention, timed like flashattn bench (warm-up, median of reps, CUDA events).\n"
    "import sys, torch\n"
    "import torch.nn.functional as F\n"
    "from torch.nn.attention import sdpa_kernel, SDPBackend\n"
    "reps = int(sys.argv[1])\n"
    "backends = [('torch-flash', SDPBackend.FLASH_ATTENTION), ('torch-cudnn', SDPBackend.CUDNN_ATTENTION)]\n"
    "print('name,batch,heads,seqlen,head_dim,causal,pass,ms,tflops', flush=True)\n"
    "for spec in sys.argv[2:]:\n"
    "    B, H, N, D, causal, bwd = (int(x) for x in spec.split(':'))\n"
    "    for name, be in backends:\n"
    "        try:\n"
    "            q, k, v = (torch.randn(B, H, N, D, device='cuda', dtype=torch.bfloat16, requires_grad=bool(bwd)) for _ in range(3))\n"
    "            with sdpa_kernel(be):\n"
    "                o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))\n"
    "                do = torch.randn_like(o)\n"
    "                def step():\n"
    "                    if bwd: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)\n"
    "                    else: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))\n"
    "                step(); torch.cuda.synchronize()\n"
    "                ts = []\n"
    "                for _ in range(reps):\n"
    "                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)\n"
    "                    a.record(); step(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))\n"
    "            ts.sort(); ms = ts[len(ts) // 2] if len(ts) % 2 else 0.5 * (ts[len(ts) // 2 - 1] + ts[len(ts) // 2])\n"
    "            fl = 4.0 * B * H * N * N * D * (0.5 if causal else 1.0) * (2.5 if bwd else 1.0)\n"
    "            print(f'{name},{B},{H},{N},{D},{causal},{\"bwd\" if bwd else \"fwd\"},{ms:.4f},{fl / ms / 1e9:.2f}', flush=True)\n"
    "            del q, k, v, o, do\n"
    "        except Exception as e:\n"
    "            print(f'# {name} B={B} H={H} N={N} D={D}: {type(e).__name__}', flush=True)\n"
    "        torch.cuda.empty_cache()\n";

void report_torch(report *R) {
    if (system("python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1") != 0) {
        snprintf(R->torch_status, sizeof R->torch_status,
                 "PyTorch with CUDA is not installed here (python3 -c 'import torch' failed), so there is no SDPA "
                 "reference line");
        return;
    }
    char path[2048];
    snprintf(path, sizeof path, "%s/torch_sdpa.py", R->out);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(TORCH_SCRIPT, f);
    fclose(f);
    /* the configurations of the GPU speed section */
    char cmd[8192];
    size_t o = (size_t)snprintf(cmd, sizeof cmd, "cd '%s' && python3 torch_sdpa.py %d", R->out, R->p.reps);
    for (int i = 0; i < R->gpu.speed.n && o < sizeof cmd - 64; i++) {
        const bench_row *r = &R->gpu.speed.v[i];
        if (r->algo != FA_ALGO_FLASH2) continue;
        o += (size_t)snprintf(cmd + o, sizeof cmd - o, " %lld:%lld:%lld:%lld:%d:%d", (long long)r->cfg.batch,
                              (long long)r->cfg.heads, (long long)r->cfg.seqlen_q, (long long)r->cfg.head_dim,
                              r->cfg.causal, r->cfg.backward);
    }
    snprintf(cmd + o, sizeof cmd - o, " 2>/dev/null");
    if (R->repro) fprintf(R->repro, "torch_cuda.csv\t(python3 torch_sdpa.py, see index.md)\n");
    FILE *p = popen(cmd, "r");
    if (!p) return;
    snprintf(path, sizeof path, "%s/torch_cuda.csv", R->out);
    FILE *csv = fopen(path, "w");
    char line[512];
    while (fgets(line, sizeof line, p)) {
        if (csv) fputs(line, csv);
        if (line[0] == '#' || strncmp(line, "name,", 5) == 0 || R->n_torch >= 256) continue;
        torch_row *t = &R->torch[R->n_torch];
        char pass[8];
        long long b, h, n, d;
        if (sscanf(line, "%23[^,],%lld,%lld,%lld,%lld,%d,%7[^,],%lf,%lf", t->name, &b, &h, &n, &d, &t->causal, pass,
                   &t->ms, &t->tflops) == 9) {
            t->b = b, t->h = h, t->n = n, t->d = d;
            t->bwd = strcmp(pass, "bwd") == 0;
            R->n_torch++;
        }
        R->work_done += 0.1;
    }
    pclose(p);
    if (csv) fclose(csv);
    snprintf(R->torch_status, sizeof R->torch_status,
             "PyTorch SDPA (flash and cuDNN backends, bf16) timed on the same shapes: %d rows in torch_cuda.csv (script: "
             "torch_sdpa.py)",
             R->n_torch);
}
