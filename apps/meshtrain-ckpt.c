/* meshtrain-ckpt: thin main; all logic lives in libmeshtrain (src/ckpt_cli.c).
 * Needs no MPI launch: it never calls MPI_Init. */
#include <stdio.h>

#include "mt_ckpt_cli.h"

int main(int argc, char **argv)
{
    return mt_ckpt_main(argc, argv, stdout, stderr);
}
