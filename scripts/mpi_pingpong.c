/* An MPI ping-pong between two ranks, run by scripts/ci-stacks.sh (one host) and
 * scripts/ci-netns.sh (rank 0 and rank 1 in two network namespaces). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* Rank 0 and 1 bounce a message; rank 0 prints the half round trip and the rate. */
int main(int argc, char **argv)
{
	int rank, sizes[] = { 8, 4096, 65536, 1 << 20 };
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	for (int s = 0; s < 4; s++) {
		int n = sizes[s], iters = n >= 65536 ? 200 : 2000;
		char *buf = malloc(n);
		memset(buf, rank, n);
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		for (int i = 0; i < iters; i++) {
			if (rank == 0) {
				MPI_Send(buf, n, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
				MPI_Recv(buf, n, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			} else {
				MPI_Recv(buf, n, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				MPI_Send(buf, n, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
			}
		}
		double t = MPI_Wtime() - t0;
		if (rank == 0)
			printf("%8d bytes %9.2f us %9.2f MB/s\n", n, t / iters / 2 * 1e6,
			       2.0 * n * iters / t / 1e6);
		free(buf);
	}
	MPI_Finalize();
	return 0;
}
