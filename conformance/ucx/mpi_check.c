/* A real MPI program for rocectl: allreduce, broadcast and a tagged ping-pong with data checks. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    int rank, size, i, n, errors = 0;
    char host[MPI_MAX_PROCESSOR_NAME];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(host, &n);

    /* allreduce of 1M doubles (rendezvous-sized) */
    n = 1 << 20;
    double *in = malloc(n * sizeof(double)), *out = malloc(n * sizeof(double));
    for (i = 0; i < n; i++) in[i] = (double)(rank + 1) * i;
    MPI_Allreduce(in, out, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double k = size * (size + 1) / 2.0;
    for (i = 0; i < n; i++) if (out[i] != k * i) { errors++; break; }

    /* broadcast */
    long token = rank == 0 ? 0x1234567890abcdefL : 0;
    MPI_Bcast(&token, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    if (token != 0x1234567890abcdefL) errors++;

    /* ping-pong 0 <-> 1, sizes 1 B .. 4 MiB, the payload checked each way */
    if (size >= 2 && rank < 2) {
        int peer = 1 - rank, iters = 20;
        char *buf = malloc(4 << 20);
        for (int sz = 1; sz <= (4 << 20); sz *= 4) {
            double t0 = MPI_Wtime();
            for (int it = 0; it < iters; it++) {
                if (rank == 0) {
                    memset(buf, (char)(sz + it), sz);
                    MPI_Send(buf, sz, MPI_CHAR, peer, it, MPI_COMM_WORLD);
                    MPI_Recv(buf, sz, MPI_CHAR, peer, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    if (buf[0] != (char)(sz + it + 1) || buf[sz - 1] != (char)(sz + it + 1)) errors++;
                } else {
                    MPI_Recv(buf, sz, MPI_CHAR, peer, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    if (buf[0] != (char)(sz + it) || buf[sz - 1] != (char)(sz + it)) errors++;
                    memset(buf, (char)(sz + it + 1), sz);
                    MPI_Send(buf, sz, MPI_CHAR, peer, it, MPI_COMM_WORLD);
                }
            }
            double t = (MPI_Wtime() - t0) / iters / 2;
            if (rank == 0)
                printf("pingpong %8d B: %9.1f us  %8.1f MB/s\n", sz, t * 1e6, sz / t / 1e6);
        }
        free(buf);
    }
    int total;
    MPI_Allreduce(&errors, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d of %d on %s: %s\n", rank, size, host, total ? "FAILED" : "ok");
    MPI_Finalize();
    return total != 0;
}
