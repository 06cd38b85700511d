/* meshtrain-data: thin main; all logic lives in libmeshtrain
 * (src/data/data_write.c).  Needs no MPI launch: it never calls MPI_Init. */
#include <stdio.h>

#include "mt_data.h"

int main(int argc, char **argv)
{
    return mt_data_main(argc, argv, stdout, stderr);
}
