package images

import (
	"context"
	"errors"

	"computeplane/gen/api"
)

// Service implements api.ImagesService over a Source.
type Service struct{ Source Source }

var _ api.ImagesService = Service{}

func output(im *Image) api.Image {
	out := api.Image{
		ImageID: im.ID, Format: im.Format, SizeBytes: im.SizeBytes, Sha256: im.SHA256, Location: im.Location, Description: im.Description,
	}
	if im.Initrd != "" {
		out.Initrd = &im.Initrd
	}
	return out
}

// List answers images.list.
func (s Service) List(ctx context.Context, _ *api.ImagesListInput) (*api.ImageList, error) {
	ims, err := s.Source.List(ctx)
	if err != nil {
		return nil, err
	}
	out := &api.ImageList{Items: make([]api.Image, 0, len(ims))}
	for i := range ims {
		out.Items = append(out.Items, output(&ims[i]))
	}
	return out, nil
}

// Get answers images.get.
func (s Service) Get(ctx context.Context, in *api.ImagesGetInput) (*api.Image, error) {
	im, err := s.Source.Get(ctx, in.ImageID)
	if errors.Is(err, ErrNotFound) {
		return nil, api.Errorf(api.CodeNotFound, "imageId: image %s not found in the image source", in.ImageID)
	}
	if err != nil {
		return nil, err
	}
	out := output(im)
	return &out, nil
}
