/* meshtrain-cp: thin main; all logic lives in libmeshtrain (src/app/app.c). */
#include "mt_app.h"

int main(int argc, char **argv)
{
    return mt_app_main(MT_APP_CP, argc, argv);
}
