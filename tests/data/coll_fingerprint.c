/* Fingerprint of the algorithm an MPI library ran for one MPI_Allreduce or MPI_Reduce_scatter_block
 * of float sums: the summation order is the algorithm's, and with inputs spread over many binary
 * orders of magnitude every order rounds differently, so a hash of the result buffer tells the
 * algorithms apart without timing anything. Usage: mpirun -np N coll_fingerprint OP BYTES
 * (OP allreduce|reduce_scatter; BYTES as commbench's: the whole buffer). Rank 0 prints the hash. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 3 || (strcmp(argv[1], "allreduce") && strcmp(argv[1], "reduce_scatter"))) {
        if (rank == 0) fprintf(stderr, "usage: coll_fingerprint allreduce|reduce_scatter BYTES\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    size_t count = strtoull(argv[2], NULL, 10) / sizeof(float);
    int scatter = strcmp(argv[1], "reduce_scatter") == 0;
    count -= count % (size_t)size;
    float *in = malloc(count * sizeof(float)), *out = malloc(count * sizeof(float));
    uint64_t state = 0x9E3779B97F4A7C15ull * (uint64_t)(rank + 1);
    for (size_t i = 0; i < count; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        int exponent = (int)(state >> 59) - 16; /* 2^-16 .. 2^15 */
        in[i] = (float)((double)((state >> 40) & 0xFFFFF) / 1048576.0 * (exponent < 0 ? 1.0 / (1 << -exponent) : (double)(1 << exponent)));
    }
    size_t out_count = count;
    if (scatter) {
        out_count = count / (size_t)size;
        MPI_Reduce_scatter_block(in, out, (int)out_count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else {
        MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    uint64_t hash = 1469598103934665603ull; /* FNV-1a over this rank's result bytes */
    const unsigned char *bytes = (const unsigned char *)out;
    for (size_t i = 0; i < out_count * sizeof(float); i++) hash = (hash ^ bytes[i]) * 1099511628211ull;
    uint64_t *hashes = malloc((size_t)size * sizeof hash);
    MPI_Gather(&hash, 1, MPI_UINT64_T, hashes, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        uint64_t combined = 1469598103934665603ull; /* in rank order */
        for (int r = 0; r < size; r++) combined = (combined ^ hashes[r]) * 1099511628211ull;
        printf("%016llx\n", (unsigned long long)combined);
    }
    free(hashes);
    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}
